"""Host side of the fast quantizers: hq_quantize, hla_quantize and the fused g_y pass.

Same function as hot.reference.ops (see hot.common.ops for the math); the stochastic rounding
consumes the hash stream of hot.common.quant, so inside ``quant.hash_rng()`` the reference
reproduces the codes (up to the ~1-ulp transform differences documented in the tests).
bits = 0 and float64 inputs delegate to the reference (no integer kernel is involved).
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from typing import Optional

import torch

from ..common import quant
from ..common.config import BLOCK
from ..common.ops import pad_to
from ..common.walsh import hadamard16, hla_matrix, hla_rows, sequency, sylvester
from ..reference import ops as ref
from . import native
from .arch import AUTOTUNE, INTERPRET, QKERNEL, QKERNELS, env_flag
from .launch import Meta, _spec

# Tile of one program: multiples of 16 (whole Hadamard / Walsh blocks in both directions).
# HOT_FAST_QTILE="R,C,warps" overrides it (benchmarks/sweep_gy_pass.py sweeps it on a GPU).
BLOCK_R, BLOCK_C, NUM_WARPS = (int(v) for v in os.environ.get("HOT_FAST_QTILE", "64,64,4").split(","))


# Scale outputs are allocated in multiples of this many floats: csrc/binding.cpp's kScalePad.
SCALE_PAD = 256


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _mats(device: torch.device, rank: int, selection: str):
    """(H16 (16 x 16), T (RP x 16) = T_r with zero rows up to RP), float32, cached per device;
    the kernels expand them to block-diagonal tile matrices in registers."""
    t = torch.zeros(_pow2(rank), BLOCK, dtype=torch.float64)
    t[:rank] = hla_matrix(rank, selection)
    return (hadamard16().to(torch.float32).contiguous().to(device),
            t.to(torch.float32).contiguous().to(device))


# Tiles the GPU autotuner tries (BLOCK_R, BLOCK_C, warps); BLOCK_R / 16 * RP must be >= 16.
_TILES = ((64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 8), (32, 128, 4), (64, 256, 8))


# Quantize-kernel variants (HOT_FAST_QKERNEL, read once in hot.fast.arch; tests and
# benchmarks/quant_variants.py set QKERNEL_VARIANT and clear the _kernels / _pass_plan caches):
# name -> (HQ_METHOD, HLA_METHOD, split HQ and HLA into separate programs[, the stats kernel's
# HQ_METHOD and HLA_METHOD when they differ]), methods as in hot/fast/quant_kernels_v4.py; "dot"
# is quant_kernels.py's pair of kernels. "mix" pairs the fastest stats (k16_bfly) and quantize
# (bflyv) kernels measured on an H100 (docs/kernels.md): its amax comes from a transform that
# differs from the quantize kernel's by float rounding order only, as "dot" differs from the
# reference, so the scales and codes stay within the same flip bounds (tests).
_VARIANTS = {"dot": None, "k16": ("k16", "dot", False), "k16_bfly": ("k16", "bfly", False),
             "bfly": ("bfly", "bfly", False), "bflyv": ("bflyv", "bfly", False),
             "bfly_split": ("bfly", "bfly", True), "mix": ("bflyv", "bfly", False, "k16", "bfly")}
assert tuple(_VARIANTS) == QKERNELS
QKERNEL_VARIANT = QKERNEL


def _sel(rank: int, selection: str) -> int:
    """The kept Walsh rows as Sylvester row numbers, 4 bits each (quant_kernels_v4's SEL):
    walsh(16) row k is sylvester(16) row order[k] / 4 (the rows sorted by sequency)."""
    order = torch.argsort(sequency(sylvester(BLOCK)), stable=True).tolist()
    return sum(order[k] << (4 * t) for t, k in enumerate(hla_rows(rank, selection)))


@functools.lru_cache(maxsize=None)
def _kernels(min_br: int, fixed: Optional[tuple], variant: str = "dot"):
    """(stats, quant, tile): launchers called as launcher(grid_fn, args, meta) with meta a
    hot.fast.launch.Meta of the kernel's switches plus ``tile``. One fixed tile (BLOCK_R x
    BLOCK_C, HOT_FAST_QTILE; always in the interpreter) launched through launch.Direct, or, with
    HOT_FAST_AUTOTUNE=1 on a GPU, tiles autotuned over _TILES (keyed by shape and switches) by
    Triton's autotuner; then ``tile`` is empty.

    Autotuning is off by default: it compiles every tile for every kernel specialization on
    first use (12 Triton compiles per dtype x scale-mode x HQ/HLA combination)."""
    import triton

    from .launch import Direct

    if variant == "dot":
        from .quant_kernels import quant_kernel, stats_kernel
    else:
        from .quant_kernels_v4 import quant_kernel_v4 as quant_kernel
        from .quant_kernels_v4 import stats_kernel_v4 as stats_kernel

    tiles = [fixed] if fixed else [t for t in _TILES if t[0] >= min_br]
    if fixed or INTERPRET or not AUTOTUNE:
        br, bc, w = tiles[0] if fixed else (max(BLOCK_R, min_br), BLOCK_C, NUM_WARPS)
        tile = dict(BLOCK_R=br, BLOCK_C=bc, num_warps=w)
        st, qu = Direct(stats_kernel), Direct(quant_kernel)
        return (lambda g, a, m, k=None: st(g, a, m, k), lambda g, a, m, k=None: qu(g, a, m, k), tile)
    cfgs = [triton.Config({"BLOCK_R": br, "BLOCK_C": bc}, num_warps=w) for br, bc, w in tiles]
    key = ["R", "C", "DO_HQ", "DO_HLA", "HQ_ROW", "HLA_ROW", "DOT_DTYPE"]
    # Short timing runs: the tile choice is coarse, and every new shape pays this once.
    st = triton.autotune(cfgs, key=key, warmup=5, rep=20)(stats_kernel)
    qu = triton.autotune(cfgs, key=key, warmup=5, rep=20)(quant_kernel)
    return (lambda g, a, m, k=None: st[g](*a, **m.kw), lambda g, a, m, k=None: qu[g](*a, **m.kw), {})


_FIXED = tuple(int(v) for v in os.environ["HOT_FAST_QTILE"].split(",")) \
    if os.environ.get("HOT_FAST_QTILE") else None


def _key(seed: int) -> int:
    """quant.seed_key as a signed 32-bit pattern (Triton int arguments are int32)."""
    k = quant.seed_key(seed)
    return k - (1 << 32) if k >= (1 << 31) else k


def _dot_types_of(dtype: torch.dtype, dev: torch.device):
    """(Triton dot dtype name, input_precision) for the transform dots.

    bf16/fp16 inputs times the +-1/4 matrices are exact products, summed in fp32 by the tensor
    cores; fp32 inputs need a full-precision fp32 dot. The interpreter's bf16 dot is not exact,
    so it always uses fp32."""
    if dtype == torch.float32 or INTERPRET or dev.type != "cuda":
        return "fp32", "ieee"
    return ("bf16" if dtype == torch.bfloat16 else "fp16"), "ieee"


def _check(x: torch.Tensor, what: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"fast {what}: expected a 2-D tensor, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"fast {what}: dtype {x.dtype} is not supported (float32/bfloat16/float16)")


_TL = {}


def _tl_dtype(name: str):
    if not _TL:
        import triton.language as tl

        _TL.update(fp32=tl.float32, bf16=tl.bfloat16, fp16=tl.float16)
    return _TL[name]


# int64 offsets in every quantizer kernel even where int32 suffices (tests and A/B timing).
FORCE_IDX64 = env_flag("HOT_FAST_IDX64")


class _Workspace:
    """The epoch-tagged absmax vector of the stats kernel, reused across calls (no memset).

    One per (device, stream): calls on one stream run in order, so a call's stats kernel never
    overlaps the previous call's quantize kernel. Each call takes the next epoch; an entry tagged
    with an older epoch loses to the first atomic_max of the new call (quant_kernels docstring)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.buf: dict = {}  # (device, stream) -> [int64 tensor, last epoch]

    def take(self, dev: torch.device, n: int):
        stream = torch._C._cuda_getCurrentRawStream(dev.index) if dev.type == "cuda" else 0
        with self.lock:
            e = self.buf.get((dev, stream))
            if e is None or e[0].numel() < n or e[1] >= (1 << 31) - 2:
                # Zeros: epoch 0 is never used, so fresh entries lose to the first call's values.
                e = self.buf[(dev, stream)] = [torch.zeros(max(n, 1 << 14), dtype=torch.int64, device=dev), 0]
            e[1] += 1
            return e[0], e[1]


_WS = _Workspace()


# A unique id per pass plan: the launch cache key of its kernels (launch.Direct).
_PLAN_IDS = itertools.count()


def bsum_capable() -> bool:
    """Whether the stats kernel in use can also form the bias partial sums (gy_pass bsum=True):
    the v4 kernels with butterfly HLA, on one fixed tile (the sums are per row of tiles)."""
    v4 = _VARIANTS[QKERNEL_VARIANT]
    stats_hla = (v4[4] if len(v4) > 3 else v4[1]) if v4 else "dot"
    return stats_hla == "bfly" and (INTERPRET or not AUTOTUNE or _FIXED is not None)


@functools.lru_cache(maxsize=4096)
def _pass_plan(r: int, c: int, sx: tuple, dtype: torch.dtype, dev: torch.device,
               hq: Optional[tuple], hla: Optional[tuple], bsum: bool = False):
    """Everything about a g_y pass that does not depend on the data or the seeds (cached):
    (sizes, matrices, launchers, grid function, constexpr switches of stats and quantize)."""
    c16, l16 = pad_to(c), pad_to(r)
    rank, selection = (hla[0], hla[1]) if hla else (BLOCK, "lowpass")
    rp = _pow2(rank)
    h16, t = _mats(dev, rank, selection)
    variant = QKERNEL_VARIANT
    v4 = _VARIANTS[variant]
    # tl.dot needs every dimension >= 16: the HLA dot has BLOCK_R / 16 * RP rows.
    hla_dot = hla is not None and (v4 is None or v4[1] == "dot")
    stats, quant_, tile = _kernels(256 // rp if hla_dot else 16, _FIXED, variant)
    split = bool(v4 and v4[2] and hq and hla)
    dname, prec = _dot_types_of(dtype, dev)
    hq_row = bool(hq and hq[1] == "row")
    hla_row = bool(hla and hla[3] == "row")
    nh = (r if hq_row else 1) if hq else 0
    nl = (c if hla_row else 1) if hla else 0
    lr = l16 // BLOCK * rank
    grid = lambda m: ((l16 + m["BLOCK_R"] - 1) // m["BLOCK_R"],  # noqa: E731
                      (c16 + m["BLOCK_C"] - 1) // m["BLOCK_C"], 1 + split)
    # Every offset a kernel forms (x with its strides, the HQ and HLA codes) below 2^31?
    reach = max(r * c16, c * lr, (r - 1) * abs(sx[0]) + (c - 1) * abs(sx[1]) + 1)
    if bsum and not (hla is not None and bsum_capable()):
        raise ValueError("gy_pass(bsum=True) needs the HLA part and a v4 stats kernel with "
                         f"butterfly HLA on a fixed tile (variant {variant!r})")
    sw = dict(DO_HQ=hq is not None, DO_HLA=hla is not None, HQ_ROW=hq_row, HLA_ROW=hla_row,
              DOT_DTYPE=_tl_dtype(dname), PREC=prec, RP=rp, DO_BSUM=bsum,
              IDX64=FORCE_IDX64 or reach + max(c16, l16) >= 1 << 31)
    if v4:
        # EVEN: every tile lies inside x (a fixed tile dividing both sides), so the kernels load
        # and store unmasked (ViT-B and Llama shapes; about 4% of the quantize kernel's work).
        even = bool(tile) and r % tile["BLOCK_R"] == 0 and c % tile["BLOCK_C"] == 0
        sw.update(HQ_METHOD=v4[0], HLA_METHOD=v4[1], HLA_PART=int(split), SEL=_sel(rank, selection),
                  EVEN=even)
    qsw = dict({k: v for k, v in sw.items() if k != "DO_BSUM"}, RANK=rank, HQ_QMAX=float(quant.qmax(hq[0])) if hq else 1.0,
               HQ_STOCH=bool(hq and hq[2]), HLA_QMAX=float(quant.qmax(hla[2])) if hla else 1.0,
               HLA_STOCH=bool(hla and hla[4]),
               # The spec rounds t * r and v + u separately: no FMA contraction (quant_kernels).
               enable_fp_fusion=False)
    if v4 and len(v4) > 3:
        sw.update(HQ_METHOD=v4[3], HLA_METHOD=v4[4])
    if tile:  # a fixed tile: the grid is known now
        grid = grid(tile)
    return dict(c16=c16, l16=l16, lr=lr, nh=nh, nl=nl, h16=h16, t=t, stats=stats, quant=quant_,
                uid=next(_PLAN_IDS), bsum=bsum,
                hq_spad=pad_to(nh, SCALE_PAD), hla_spad=pad_to(nl, SCALE_PAD),
                grid=grid, sw=Meta(**sw, **tile), qsw=Meta(**qsw, **tile))


def plan_for(x: torch.Tensor, hq: Optional[tuple], hla: Optional[tuple], bsum: bool = False) -> dict:
    """The cached pass plan of x's shape, strides, dtype and device (hq / hla / bsum as in gy_pass)."""
    r, c = x.shape
    return _pass_plan(r, c, x.stride(), x.dtype, x.device, hq[:3] if hq else None,
                      hla[:5] if hla else None, bsum)


def pass_args(x: torch.Tensor, p: dict, hq: Optional[tuple], hla: Optional[tuple]):
    """The runtime arguments of one pass over x with plan p: (stats_args, quant_args, outputs),
    outputs = (hq_q, hq_s, hla_q, hla_s) that quant_args fill (None for a part not asked for);
    with a bsum plan, stats_args[_BSUM_ARG] is the (C, row tiles) float32 buffer of the bias
    partial sums that the stats kernel fills. Takes the next epoch of the absmax workspace. Shared by gy_pass and the benchmarks that
    launch the two kernels separately (benchmarks/gy_pass_breakdown.py, quant_variants.py)."""
    r, c = x.shape
    dev = x.device
    nh, nl = p["nh"], p["nl"]
    amax, epoch = _WS.take(dev, nh + nl + 1)
    base = (x, x.stride(0), x.stride(1), r, c, p["h16"], p["t"], amax, amax[nh:] if nh else amax)
    hq_q = hq_s = hla_q = hla_s = None
    # Scales in allocations padded to SCALE_PAD floats: the CUTLASS GEMMs then read them in place
    # (csrc/binding.cpp, scale_vector) instead of copying them into padded vectors. One storage
    # each: outputs of a torch.library op must not alias one another.
    if hq:
        hq_q = torch.empty((r, p["c16"]), dtype=torch.int8, device=dev)
        hq_s = torch.empty(p["hq_spad"], dtype=torch.float32, device=dev).as_strided((nh, 1), (1, 1))
    if hla:
        hla_q = torch.empty((c, p["lr"]), dtype=torch.int8, device=dev)
        hla_s = torch.empty(p["hla_spad"], dtype=torch.float32, device=dev).as_strided((nl, 1), (1, 1))
    quant_args = base + (
        hq_q if hq else amax, hq_s if hq else amax, p["c16"], _key(hq[3]) if hq else 0,
        hla_q if hla else amax, hla_s if hla else amax, p["lr"], p["l16"] // BLOCK,
        _key(hla[5]) if hla else 0)
    bsum = torch.empty((c, p["grid"][0]), dtype=torch.float32, device=dev) if p["bsum"] else amax
    return base + (epoch, bsum), quant_args, (hq_q, hq_s, hla_q, hla_s)


# Where the varying integers and the bias partial sums sit in the kernels' argument lists
# (pass_args' order).
_EPOCH_ARG, _BSUM_ARG, _HQ_KEY_ARG, _HLA_KEY_ARG = 9, 10, 12, 17


def gy_pass(x: torch.Tensor, hq: Optional[tuple], hla: Optional[tuple], bsum: bool = False):
    """Two launches over x (stats, then quantize) for HQ and/or HLA; no memset, no host sync.

    hq  = (bits, scale_mode, stochastic, seed)                    -> (q (R, C16), scale)
    hla = (rank, selection, bits, scale_mode, stochastic, seed)   -> (q (C, L16/16*rank), scale)
    Returns (hq_q, hq_s, hla_q, hla_s), None for a part not asked for. Both bits must be > 0.
    The scales are formed inside quant_kernel. bsum=True (HLA asked for, bsum_capable()) also
    returns x's column sums in float32 (C,) as a fifth output, summed by the stats kernel per
    row of tiles and then over those rows: the bias gradient without another read of x.
    """
    p = plan_for(x, hq, hla, bsum)
    out = native.quant_pass(x, p, hq, hla)  # one C++ call once the plan's kernels are registered
    if out is not None:
        return out if bsum else out[:4]
    stats_args, quant_args, outputs = pass_args(x, p, hq, hla)
    # Launch keys: the plan fixes every shape argument, the matrices and the alignment of the
    # workspace view (a fresh allocation offset by nh entries) and of the fresh outputs. What
    # varies is x's alignment, the epoch and the seed keys (Triton specializes ints on == 1 and
    # divisibility by 16).
    xa = x.data_ptr() % 16 == 0
    ks = p["stats"](p["grid"], stats_args, p["sw"], (p["uid"], xa, _spec(stats_args[_EPOCH_ARG])))
    kq = p["quant"](p["grid"], quant_args, p["qsw"], (p["uid"], xa, _spec(quant_args[_HQ_KEY_ARG]),
                                                      _spec(quant_args[_HLA_KEY_ARG])))
    native.register(p, x, ks, kq, (len(stats_args), len(quant_args)))
    return outputs + (stats_args[_BSUM_ARG].sum(1),) if bsum else outputs


def _tag(q: torch.Tensor, bits: int) -> torch.Tensor:
    # Codes within [-7, 7] may use the packed int4 GEMM on Ampere (hot.fast.gemm).
    from .gemm import tag_small_codes

    return tag_small_codes(q) if bits <= 4 else q


def _delegate(x: torch.Tensor, bits: int) -> bool:
    return bits == 0 or x.dtype == torch.float64 or x.numel() == 0


def hq_quantize(x, bits, scale_mode, stochastic, seed):
    if _delegate(x, bits):
        return ref.hq_quantize(x, bits, scale_mode, stochastic, seed)
    _check(x, "hq_quantize")
    q, s, _, _ = gy_pass(x, (bits, scale_mode, stochastic, seed), None)
    return _tag(q, bits), s


def hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed):
    if _delegate(x, bits):
        return ref.hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed)
    _check(x, "hla_quantize")
    _, _, q, s = gy_pass(x, None, (rank, selection, bits, scale_mode, stochastic, seed))
    return _tag(q, bits), s


def gy_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection, hla_bits,
                hla_scale_mode, hla_stochastic, hla_seed):
    """The fused g_y pass: (hq_quantize(x, ...), hla_quantize(x, ...)) from one read of each tile."""
    if _delegate(x, hq_bits) or _delegate(x, hla_bits):
        a = hq_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed)
        b = hla_quantize(x, rank, selection, hla_bits, hla_scale_mode, hla_stochastic, hla_seed)
        return a[0], a[1], b[0], b[1]
    _check(x, "gy_quantize")
    q1, s1, q2, s2 = gy_pass(x, (hq_bits, hq_scale_mode, hq_stochastic, hq_seed),
                             (rank, selection, hla_bits, hla_scale_mode, hla_stochastic, hla_seed))
    return _tag(q1, hq_bits), s1, _tag(q2, hla_bits), s2
