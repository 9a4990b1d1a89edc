"""Quantizer pass plans: what a pass of hot.fast.kernels.quantize over one tensor needs beyond the
data and the seeds, shared by the Python launch (hot.fast.quantize) and the C++ launch
(hot.fast.native).

A plan is cached per (shape, strides, dtype, device, HQ part, HLA part, bias sums): sizes, the
compiled-kernel launchers, the grid and the constexpr switches. ``pass_args`` adds the per-call
arguments (outputs, the absmax workspace, the seed keys) as named tuples whose field
order is the kernels' parameter order.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch

from ..common import quant
from ..common.config import BLOCK
from ..common.ops import HLAArgs, HQArgs, ScaleMode, pad_to
from ..common.options import on_change, options
from ..common.config import DRAWN_SELECTIONS
from ..common.walsh import band_weights, hla_rows, hla_weights, sequency, sylvester
from .launch import Direct, Meta

# Scale outputs are allocated in multiples of this many floats: csrc/binding.cpp's kScalePad.
SCALE_PAD = 256
# The delayed fix-up's programs in all: about 4 per SM of a 132-SM H100 (docs/kernels.md)
FIXUP_PROGRAMS = 4 * 132

# rows_kernel's widest chunk of a row (rows_tile).
ROWS_MAX_COLS = 4096

# Tiles the GPU autotuner tries (rows, cols, warps).
_TILES = ((64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 8), (32, 128, 4), (64, 256, 8))


def _args(name: str, doc: str, *fields: tuple) -> type:
    """A NamedTuple of a kernel's runtime parameters: x and its strides and sizes, then
    ``fields``, in the kernel signature's order (the native launch and the launch keys rely
    on it; tests/fast check the names against the kernels')."""
    t = NamedTuple(name, [("x", torch.Tensor), ("sxr", int), ("sxc", int), ("R", int),
                          ("C", int), *fields])
    t.__doc__ = doc
    return t


_T, _I = torch.Tensor, int
StatsArgs = _args("StatsArgs", "Runtime parameters of stats_kernel.",
                  ("hq_amax", _T), ("hla_amax", _T), ("bsum", _T))
QuantizeArgs = _args(
    "QuantizeArgs", "Runtime parameters of quantize_kernel.",
    ("hq_amax", _T), ("hla_amax", _T), ("hq_q", _T), ("hq_s", _T), ("C16", _I), ("hq_key", _I),
    ("hla_q", _T), ("hla_s", _T), ("LR", _I), ("NBLK", _I), ("hla_key", _I), ("hla_draw", _I),
    ("step", _T))
OnepassArgs = _args(
    "OnepassArgs", "Runtime parameters of onepass_kernel.",
    ("hq_amax", _T), ("hla_amax", _T), ("sync", _T), ("hist", _T), ("bsum", _T), ("hq_q", _T),
    ("hq_s", _T), ("C16", _I), ("hq_key", _I), ("hla_q", _T), ("LR", _I), ("NBLK", _I),
    ("hla_key", _I), ("step", _T), ("N_RT", _I), ("N_CT", _I))
FixupArgs = _args(
    "FixupArgs", "Runtime parameters of fixup_kernel.",
    ("hla_amax", _T), ("hist", _T), ("count", _T), ("hla_q", _T), ("hla_s", _T), ("LR", _I),
    ("NBLK", _I), ("hla_key", _I), ("step", _T), ("N_RT", _I))


class PassOutputs(NamedTuple):
    """What a pass writes: codes and scales of each part asked for (None otherwise) and, for a
    bias-sum plan, the (C, row tiles) float32 partial column sums."""

    hq_q: Optional[torch.Tensor]
    hq_s: Optional[torch.Tensor]
    hla_q: Optional[torch.Tensor]
    hla_s: Optional[torch.Tensor]
    bsum: Optional[torch.Tensor]


class PassRoute(NamedTuple):
    """A launch of a plan's passes other than from Python, registered behind
    hot.fast.quantize.run_pass (hot.fast.native's C++ launch).

    ``run(x, p, hq, hla)``: the pass's outputs as run_pass gives them (bias sums summed), or
    None where the route does not have plan p's kernels for x. ``adopt(p, x, stats_k,
    quantize_k, nargs)``: after a Python launch of plan p over x, the compiled kernels it ran
    and how many runtime arguments each took; the route may take p's later passes."""

    run: Callable
    adopt: Callable


@dataclass(frozen=True, eq=False)
class PassPlan:
    c16: int
    l16: int
    lr: int
    nh: int  # HQ scales (rows, 1 per tensor, 0 when HQ is off)
    nl: int  # HLA scales (columns, 1 per tensor, 0 when HLA is off)
    stats: Callable
    quantize: Callable
    uid: int  # the launch cache key of this plan's kernels
    bsum: bool
    do_hq: bool
    do_hla: bool
    hq_spad: int
    hla_spad: int
    grid: object  # (rows of tiles, columns of tiles, 1), or a function of the tile (autotune)
    stats_meta: Optional[Meta]
    quantize_meta: Meta
    delayed: Optional["DelayedPlan"] = None  # HLAArgs.history given: the one-read kernels
    # rows_kernel alone (``quantize`` launches it; no stats kernel, no absmax workspace): HQ
    # with per-row scales, no HLA part, over rows laid out contiguously.
    rows: bool = False

    @property
    def amax_entries(self) -> int:
        """Entries of the absmax workspace its stats kernel folds into: none for a rows plan."""
        return 0 if self.rows else self.nh + self.nl


@dataclass(frozen=True, eq=False)
class DelayedPlan:
    """What a pass with a delayed HLA scale adds to its plan: onepass_kernel over the tiles of
    the fixed tile (a 1-D grid of tickets with ``band``, else (n_rt, n_ct)), then fixup_kernel
    over (fix_g, n_ct). Without ``band`` but with HQ (per-tensor HQ scales, or the interpreter,
    which runs programs one after another and so cannot wait for a band), the plan's stats and
    quantize kernels run instead, with the scales folded in between (``fold_delayed``)."""

    onepass: Callable
    fixup: Callable
    onepass_meta: Meta
    fixup_meta: Meta
    n_rt: int
    n_ct: int
    fix_g: int
    band: bool  # HQ per row, formed in onepass_kernel's bands
    onepass_ok: bool  # onepass_kernel runs this pass (else stats, fold, quantize)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _i32(v: int) -> int:
    """v mod 2^32 as a signed 32-bit value (Triton int arguments are int32)."""
    v &= quant.M32
    return v - (1 << 32) if v >= (1 << 31) else v


def seed_key(seed: int) -> int:
    """quant.seed_key as a signed 32-bit pattern."""
    return _i32(quant.seed_key(seed))


def key_arg(seed) -> int:
    """What the quantize kernel takes for a part's seed: the key of an int seed, or the base of
    a quant.StepSeed (the kernel forms the key from the step counter, kernels.quantize._key)."""
    return _i32(seed.base) if isinstance(seed, quant.StepSeed) else seed_key(seed)


def draw_arg(hla: Optional[HLAArgs]) -> int:
    """What the quantize kernel takes for a drawn selection's seed (key_arg), 0 without one."""
    return key_arg(hla.draw) if hla is not None and hla.draw is not None else 0


def step_counter(hq: Optional[HQArgs], hla: Optional[HLAArgs]) -> Optional[torch.Tensor]:
    """The step counter the pass's stochastic seeds (and a drawn selection's seed) follow, or
    None when they are plain ints. Both parts of one pass come from one layer, so they follow
    the same counter."""
    seeds = [a.seed for a in (hq, hla) if a is not None and a.stochastic]
    if hla is not None and hla.draw is not None:
        seeds.append(hla.draw)
    steps = [s for s in seeds if isinstance(s, quant.StepSeed)]
    if not steps:
        return None
    if len(steps) != len(seeds) or any(s.counter is not steps[0].counter for s in steps):
        raise ValueError("the two parts of one quantizer pass must follow the same step counter "
                         "(or both take int seeds)")
    return steps[0].counter


def _order() -> list[int]:
    """order[k]: the Sylvester row number of walsh(16) row k (the rows sorted by sequency)."""
    return torch.argsort(sequency(sylvester(BLOCK)), stable=True).tolist()


_WEIGHT_CODE = {1.0: 0, 2.0: 1, 4.0: 2}  # kernels.quantize._weighted: sqrt(w) = 1, sqrt 2, 2


def sel_code(rank: int, selection: str) -> int:
    """The kept Walsh rows as Sylvester row numbers, 4 bits each (the kernels' SEL): walsh(16)
    row k is sylvester(16) row order[k] / 4."""
    order = _order()
    return sum(order[k] << (4 * t) for t, k in enumerate(hla_rows(rank, selection)))


def weight_code(rank: int, selection: str) -> int:
    """The kept rows' weights (hla_weights), 2 bits each in SEL's order (the kernels' WSEL)."""
    return sum(_WEIGHT_CODE[w] << (2 * t) for t, w in enumerate(hla_weights(rank, selection)))


def band_code(rank: int) -> int:
    """A drawn selection's weight of every Sylvester row n, 2 bits each (the kernels' BWSEL)."""
    w = band_weights(rank)
    return sum(_WEIGHT_CODE[w[k]] << (2 * n) for k, n in enumerate(_order()))


def fixed_tile() -> bool:
    """Whether passes run on the one tile of options().tile (else Triton autotunes tiles)."""
    o = options()
    return o.interpret or not o.autotune


@functools.lru_cache(maxsize=None)
def _delayed_launchers():
    """(onepass, fixup) launchers (launch.Direct), always on the fixed tile."""
    from .kernels.quantize import fixup_kernel, onepass_kernel

    return Direct(onepass_kernel), Direct(fixup_kernel)


@functools.lru_cache(maxsize=None)
def _rows_launcher():
    """rows_kernel's launcher (launch.Direct), on its own tile (rows_tile), autotuned or not."""
    from .kernels.quantize import rows_kernel

    return Direct(rows_kernel)


def rows_tile(c16: int) -> tuple[int, int, int]:
    """rows_kernel's (BLOCK_R, BLOCK_C, NCHUNK) for rows of c16 padded columns: a whole row in
    one chunk up to ROWS_MAX_COLS, in tiles of options().tile's size (so its dot has the stats
    kernel's shape and gives the same scales bit for bit)."""
    t = options().tile
    bc = min(_pow2(c16), ROWS_MAX_COLS)
    return max(1, t.rows * t.cols // bc), bc, -(-c16 // bc)


@functools.lru_cache(maxsize=None)
def _launchers():
    """(stats, quantize): launchers called as launcher(grid, args, meta, key) (launch.Direct), or
    on autotuned kernels when tiles are autotuned (then ``key`` is ignored)."""
    import triton

    from .kernels.quantize import quantize_kernel, stats_kernel

    if fixed_tile():
        return Direct(stats_kernel), Direct(quantize_kernel)
    cfgs = [triton.Config({"BLOCK_R": br, "BLOCK_C": bc}, num_warps=w) for br, bc, w in _TILES]
    key = ["R", "C", "DO_HQ", "DO_HLA", "HQ_ROW", "HLA_ROW", "DOT_DTYPE"]
    # Short timing runs: the tile choice is coarse, and every new shape pays this once.
    st = triton.autotune(cfgs, key=key, warmup=5, rep=20)(stats_kernel)
    qu = triton.autotune(cfgs, key=key, warmup=5, rep=20)(quantize_kernel)
    return (lambda g, a, m, k=None: st[g](*a, **m.kw), lambda g, a, m, k=None: qu[g](*a, **m.kw))


def _dot_types(dtype: torch.dtype, dev: torch.device):
    """(Triton dtype, input_precision) of the stats kernel's HQ dot: bf16/fp16 inputs times the
    +-1/4 entries are exact products, summed in fp32; fp32 inputs need a full-precision fp32
    dot. The interpreter's bf16 dot is not exact, so it always uses fp32."""
    import triton.language as tl

    if dtype == torch.float32 or options().interpret or dev.type != "cuda":
        return tl.float32, "ieee"
    return (tl.bfloat16 if dtype == torch.bfloat16 else tl.float16), "ieee"


def absmax_workspace(dev: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 vector of n entries for the stats kernel's atomic maxima: per pass, so that
    nothing outlives a pass (a CUDA graph replays the memset with the pass, and no buffer made
    while a graph pool is active outlives it)."""
    return torch.zeros(max(n, 1), dtype=torch.int32, device=dev)


def pass_workspace(p: "PassPlan", dev: torch.device) -> torch.Tensor:
    """The absmax workspace of a pass of plan p: absmax_workspace, or for a plan that reads none
    (a rows plan) one int32 entry left as allocated, so no memset runs."""
    if not p.amax_entries:
        return torch.empty(1, dtype=torch.int32, device=dev)
    return absmax_workspace(dev, p.amax_entries)


_PLAN_IDS = itertools.count()


def bsum_capable() -> bool:
    """Whether passes can form the bias partial sums (gy_pass bsum=True): the sums are per row
    of tiles, so the tile must be fixed."""
    return fixed_tile()


@functools.lru_cache(maxsize=4096)
def _plan(r: int, c: int, strides: tuple, dtype: torch.dtype, dev: torch.device,
          hq: Optional[tuple], hla: Optional[tuple], bsum: bool, use_step: bool,
          delayed: bool = False, whole_rows: bool = True) -> PassPlan:
    """whole_rows=False: the stats and quantize kernels even where rows_kernel applies (tests
    and benchmarks compare the two)."""
    c16, l16 = pad_to(c), pad_to(r)
    rank, selection = (hla[0], hla[1]) if hla else (BLOCK, "lowpass")
    stats, quantize = _launchers()
    tile = options().tile
    fixed = fixed_tile()
    dot_dtype, prec = _dot_types(dtype, dev)
    hq_row = bool(hq and hq[1] == ScaleMode.ROW)
    hla_row = bool(hla and hla[3] == ScaleMode.ROW)
    nh = (r if hq_row else 1) if hq else 0
    nl = (c if hla_row else 1) if hla else 0
    lr = l16 // BLOCK * rank
    # Every offset a kernel forms (x with its strides, the HQ and HLA codes) below 2^31?
    reach = max(r * c16, c * lr, (r - 1) * abs(strides[0]) + (c - 1) * abs(strides[1]) + 1)
    if bsum and not (hla is not None and bsum_capable()):
        raise ValueError("gy_pass(bsum=True) needs the HLA part and a fixed tile "
                         "(HOT_FAST_AUTOTUNE unset)")
    if rank != _pow2(rank):
        raise ValueError(f"HLA rank {rank} is not a power of two")
    # EVEN: every tile lies inside x (a fixed tile dividing both sides), so the kernels load
    # and store unmasked (ViT-B and Llama shapes).
    even = fixed and r % tile.rows == 0 and c % tile.cols == 0
    draw = hla is not None and selection in DRAWN_SELECTIONS
    sw = dict(RANK=rank, SEL=sel_code(rank, selection), DRAW=draw, DO_HQ=hq is not None,
              DO_HLA=hla is not None, HQ_ROW=hq_row, HLA_ROW=hla_row,
              IDX64=reach + max(c16, l16) >= 1 << 31, EVEN=even)
    tile_kw = dict(BLOCK_R=tile.rows, BLOCK_C=tile.cols, num_warps=tile.warps) if fixed else {}
    stats_meta = Meta(**sw, BWSEL=band_code(rank) if draw else 0, DO_BSUM=bsum,
                      DOT_DTYPE=dot_dtype, PREC=prec, **tile_kw)
    quantize_meta = Meta(
        **sw, WSEL=weight_code(rank, selection), USE_STEP=use_step, HQ_QMAX=float(quant.qmax(hq[0])) if hq else 1.0, HQ_STOCH=bool(hq and hq[2]),
        HLA_QMAX=float(quant.qmax(hla[2])) if hla else 1.0, HLA_STOCH=bool(hla and hla[4]),
        # The spec rounds t * r and v + u separately: no FMA contraction (kernels.quantize).
        enable_fp_fusion=False, **tile_kw)

    if whole_rows and hq_row and hla is None and not bsum and not delayed and strides[1] == 1:
        br, bc, nchunk = rows_tile(c16)
        return PassPlan(
            c16=c16, l16=l16, lr=lr, nh=nh, nl=nl, stats=None, quantize=_rows_launcher(),
            uid=next(_PLAN_IDS), bsum=False, do_hq=True, do_hla=False,
            hq_spad=pad_to(nh, SCALE_PAD), hla_spad=pad_to(nl, SCALE_PAD),
            grid=(-(-r // br), 1, 1), stats_meta=None,
            quantize_meta=Meta(USE_STEP=use_step, HQ_QMAX=quantize_meta.kw["HQ_QMAX"],
                               HQ_STOCH=quantize_meta.kw["HQ_STOCH"], DOT_DTYPE=dot_dtype,
                               PREC=prec, IDX64=sw["IDX64"],
                               EVEN=r % br == 0 and c % bc == 0, BLOCK_R=br, BLOCK_C=bc,
                               NCHUNK=nchunk, num_warps=tile.warps, enable_fp_fusion=False),
            rows=True)

    def grid_of(m):
        return ((l16 + m["BLOCK_R"] - 1) // m["BLOCK_R"], (c16 + m["BLOCK_C"] - 1) // m["BLOCK_C"],
                1)

    grid = grid_of(tile_kw) if fixed else grid_of
    dp = None
    if delayed:
        if not hla_row:
            raise ValueError("a delayed HLA scale needs per-column HLA scales (HLAConfig "
                             "checks this)")
        onepass, fixup = _delayed_launchers()
        n_rt, n_ct = -(-l16 // tile.rows), -(-c16 // tile.cols)
        if draw:
            raise ValueError("a delayed HLA scale needs a fixed row selection (HLAConfig "
                             "checks this)")
        own = dict(USE_STEP=use_step, RANK=rank, SEL=sw["SEL"], IDX64=sw["IDX64"],
                   HLA_QMAX=float(quant.qmax(hla[2])), HLA_STOCH=bool(hla[4]),
                   BLOCK_R=tile.rows, BLOCK_C=tile.cols, num_warps=tile.warps,
                   enable_fp_fusion=False)
        band = hq_row and dev.type == "cuda" and not options().interpret
        dp = DelayedPlan(
            onepass, fixup,
            Meta(**own, DO_HQ=band, DO_BSUM=bsum, HQ_QMAX=quantize_meta.kw["HQ_QMAX"],
                 HQ_STOCH=quantize_meta.kw["HQ_STOCH"],
                 EVEN=r % tile.rows == 0 and c % tile.cols == 0),
            Meta(**own, EVEN=False), n_rt, n_ct,
            # the fix-up's programs per column of tiles: FIXUP_PROGRAMS in all
            max(1, min(n_rt, -(-FIXUP_PROGRAMS // n_ct))), band, band or hq is None)
    return PassPlan(c16=c16, l16=l16, lr=lr, nh=nh, nl=nl, stats=stats,
                    quantize=quantize, uid=next(_PLAN_IDS), bsum=bsum, do_hq=hq is not None,
                    do_hla=hla is not None, hq_spad=pad_to(nh, SCALE_PAD),
                    hla_spad=pad_to(nl, SCALE_PAD), grid=grid, stats_meta=stats_meta,
                    quantize_meta=quantize_meta, delayed=dp)


@on_change
def clear_plans() -> None:
    """Forget cached plans and launchers (their tile and switches come from the options)."""
    _plan.cache_clear()
    _launchers.cache_clear()
    _rows_launcher.cache_clear()
    _delayed_launchers.cache_clear()


def plan_for(x: torch.Tensor, hq: Optional[HQArgs], hla: Optional[HLAArgs],
             bsum: bool = False, use_step: Optional[bool] = None,
             whole_rows: bool = True) -> PassPlan:
    """The cached pass plan of x's shape, strides, dtype and device (hq / hla as in gy_pass);
    use_step: whether the seeds follow a step counter (found from hq / hla when None);
    whole_rows=False: never a rows plan (_plan)."""
    r, c = x.shape
    if use_step is None:
        use_step = step_counter(hq, hla) is not None
    return _plan(r, c, x.stride(), x.dtype, x.device,
                 (hq.bits, hq.scale_mode, hq.stochastic) if hq else None,
                 (hla.rank, hla.selection, hla.bits, hla.scale_mode, hla.stochastic)
                 if hla else None, bsum, use_step, hla is not None and hla.history is not None,
                 whole_rows)


def pass_args(x: torch.Tensor, p: PassPlan, hq: Optional[HQArgs],
              hla: Optional[HLAArgs]) -> tuple[StatsArgs, QuantizeArgs, PassOutputs]:
    """The runtime arguments of one pass over x with plan p, and the outputs they fill."""
    r, c = x.shape
    dev = x.device
    amax = pass_workspace(p, dev)
    step = step_counter(hq, hla)
    hla_amax = amax[p.nh:] if p.nh else amax
    hq_q = hq_s = hla_q = hla_s = None
    # Scales in allocations padded to SCALE_PAD floats: the CUTLASS GEMMs then read them in place
    # (csrc/binding.cpp, scale_vector) instead of copying them into padded vectors. One storage
    # each: outputs of a torch.library op must not alias one another.
    if hq:
        hq_q = torch.empty((r, p.c16), dtype=torch.int8, device=dev)
        hq_s = torch.empty(p.hq_spad, dtype=torch.float32, device=dev).as_strided((p.nh, 1), (1, 1))
    if hla:
        hla_q = torch.empty((c, p.lr), dtype=torch.int8, device=dev)
        hla_s = torch.empty(p.hla_spad, dtype=torch.float32, device=dev).as_strided((p.nl, 1),
                                                                                    (1, 1))
    bsum = torch.empty((c, p.grid[0]), dtype=torch.float32, device=dev) if p.bsum else None
    stats = StatsArgs(x, x.stride(0), x.stride(1), r, c, amax, hla_amax,
                      bsum if bsum is not None else amax)
    quantize = QuantizeArgs(
        x, x.stride(0), x.stride(1), r, c, amax, hla_amax,
        hq_q if hq else amax, hq_s if hq else amax, p.c16, key_arg(hq.seed) if hq else 0,
        hla_q if hla else amax, hla_s if hla else amax, p.lr, p.l16 // BLOCK,
        key_arg(hla.seed) if hla else 0, draw_arg(hla), step if step is not None else amax)
    return stats, quantize, PassOutputs(hq_q, hq_s, hla_q, hla_s, bsum)


def check_history(x: torch.Tensor, hla: HLAArgs) -> torch.Tensor:
    """hla.history, checked: a contiguous float32 vector with one entry per column of x, on x's
    device (the kernels read and write it in place)."""
    h, c = hla.history, x.shape[1]
    if h.dtype != torch.float32 or h.numel() != c or not h.is_contiguous() \
            or h.device != x.device:
        raise ValueError(f"HLAArgs.history must be a contiguous float32 vector of {c} entries "
                         f"on {x.device} (one per column of x), not {h.dtype} "
                         f"{tuple(h.shape)} on {h.device}")
    return h


def _at16(n: int) -> int:
    return (n + 3) // 4 * 4  # int32 entries to the next 16-byte boundary


def onepass_args(x: torch.Tensor, p: PassPlan, hq: Optional[HQArgs],
                 hla: HLAArgs) -> tuple[OnepassArgs, FixupArgs, PassOutputs]:
    """The runtime arguments of a one-read pass (p.delayed.onepass_ok) over x and the outputs
    they fill. One zeroed int32 workspace: the rows' HQ absmax bits, the columns' HLA absmax
    bits, the bands' counters and the ticket, the fix-up's counters (each part 16-byte
    aligned)."""
    d = p.delayed
    r, c = x.shape
    dev = x.device
    hist = check_history(x, hla)
    nh = r if d.band else 0
    o1 = _at16(nh)
    o2 = o1 + _at16(c)
    o3 = o2 + _at16(d.n_rt + 1)
    ws = absmax_workspace(dev, o3 + d.n_ct)
    hq_amax, hla_amax, sync, count = ws[:max(nh, 1)], ws[o1:o1 + c], ws[o2:o3], ws[o3:]
    step = step_counter(hq, hla)
    hq_q = hq_s = None
    if d.band:
        hq_q = torch.empty((r, p.c16), dtype=torch.int8, device=dev)
        hq_s = torch.empty(p.hq_spad, dtype=torch.float32, device=dev).as_strided((r, 1), (1, 1))
    hla_q = torch.empty((c, p.lr), dtype=torch.int8, device=dev)
    hla_s = torch.empty(p.hla_spad, dtype=torch.float32, device=dev).as_strided((c, 1), (1, 1))
    bsum = torch.empty((c, d.n_rt), dtype=torch.float32, device=dev) if p.bsum else None
    hla_key = key_arg(hla.seed)
    st = step if step is not None else ws
    one = OnepassArgs(x, x.stride(0), x.stride(1), r, c, hq_amax, hla_amax, sync, hist,
                      bsum if bsum is not None else ws, hq_q if d.band else ws,
                      hq_s if d.band else ws, p.c16, key_arg(hq.seed) if d.band else 0, hla_q,
                      p.lr, p.l16 // BLOCK, hla_key, st, d.n_rt, d.n_ct)
    fix = FixupArgs(x, x.stride(0), x.stride(1), r, c, hla_amax, hist, count, hla_q, hla_s,
                    p.lr, p.l16 // BLOCK, hla_key, st, d.n_rt)
    return one, fix, PassOutputs(hq_q, hq_s, hla_q, hla_s, bsum)


def fold_delayed(hla_amax: torch.Tensor, hist: torch.Tensor) -> None:
    """Between the stats and quantize kernels of a pass with a delayed HLA scale: put the
    numerator of quant.delayed_scale in place of each column's absmax bits (the quantize
    kernel's scale, numerator / qmax or 1 where it is 0, is then delayed_scale's), and make
    the absmax the next pass's history. A few small device operations; nothing waits."""
    a = hla_amax.view(torch.float32)
    num = quant.delayed_numerator(a, hist)
    hist.copy_(a)
    hla_amax.copy_(num.view(torch.int32))


def resident_programs(kernel, dev: torch.device) -> int:
    """How many programs of a compiled Triton kernel the GPU holds at once (its occupancy from
    registers, threads and shared memory, times the SMs)."""
    props = torch.cuda.get_device_properties(dev)
    kernel._init_handles()  # loads the module: n_regs is known from then on
    warps = int(kernel.metadata.num_warps)
    per_warp = (int(kernel.n_regs) * 32 + 255) // 256 * 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // max(per_warp * warps, 1)
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
    shared = int(kernel.metadata.shared)
    by_shared = (getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
                 // (shared + 1024)) if shared else 32
    return props.multi_processor_count * min(by_regs, by_threads, by_shared, 32)
