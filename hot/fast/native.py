"""Native launches: a quantizer pass, and a whole layer backward, as one C++ call each.

Why: a layer backward in Python is two passes of two Triton launches and two GEMM bindings with
their argument handling, about 0.4 ms of host time on the H100 machines, against tens of
microseconds of GPU work for ViT-sized layers; small layers and whole steps then wait on the
host (docs/performance.md).

How: the pass launch is a route registered behind hot.fast.quantize.run_pass (``ROUTE``;
hot.fast registers it). The first pass of a plan launches from Python through launch.Direct,
which compiles and loads its Triton kernels; ``register`` (the route's ``adopt``) then hands
both loaded kernels to the extension (csrc/triton_launch.h: their CUfunction, block size, shared
memory and argument kinds, checked there against the cubin's own parameter list), and
``quant_pass`` (the route's ``run``) launches that plan's later passes in C++
(csrc/binding.cpp ``run_pass``: the same outputs and arguments as passes.pass_args).
``layer_backward`` runs both passes of a layer backward from registered plans, and its GEMMs,
in one C++ call (hot.fast.backward).

Off under the Triton interpreter, with autotuned tiles (not one fixed compiled kernel), with
HOT_FAST_NATIVE=0, and where the extension or a registration fails; ``why_off()`` says why.
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Optional

import torch

from ..common.ops import HLAArgs, HQArgs
from ..common.options import on_change, options
from . import _ext
from .passes import (PassOutputs, PassPlan, PassRoute, absmax_workspace, draw_arg, fixed_tile,
                     key_arg, pass_workspace, step_counter)

_LOCK = threading.Lock()
_PLANS: dict = {}  # (pass plan uid, x 16-byte aligned) -> NativePlan, or False (never)
_COMPILED: dict = {}  # the same keys -> (stats kernel or None for a rows plan, quantize kernel)
_STATE: dict = {}  # "why": the first reason a registration failed
# How many passes and layer backwards ran natively (benchmarks and tests read it).
CALLS = {"quant_pass": 0, "layer_backward": 0}

# Triton signature types -> csrc/triton_launch.h argument kinds.
_KINDS = {"i32": "i", "i64": "l", "constexpr": "c"}


class NativePlan(NamedTuple):
    """A pass plan as csrc/binding.cpp reads it: the fields of its enum PassField, in order."""

    stats_id: int
    quant_id: int
    grid0: int
    grid1: int
    grid2: int
    R: int
    C: int
    C16: int
    LR: int
    NBLK: int
    nh: int
    nl: int
    hq_spad: int
    hla_spad: int
    do_hq: int
    do_hla: int
    do_bsum: int


def kinds_of(signature: dict) -> Optional[str]:
    """One letter per kernel argument of a Triton signature (name -> type, in argument order):
    'p' pointer, 'i' int32, 'l' int64, 'c' constexpr; None if any type has no native launch
    (floats, tuples, tensor descriptors)."""
    out = []
    for ty in signature.values():
        if isinstance(ty, str) and ty.startswith("*"):
            out.append("p")
        elif isinstance(ty, str) and ty in _KINDS:
            out.append(_KINDS[ty])
        else:
            return None
    return "".join(out)


def module():
    """The extension module if it has native launches, else None."""
    m = _ext.load()
    return m if m is not None and hasattr(m, "layer_backward") else None


def why_off() -> Optional[str]:
    """None when native launches are in use, else why not."""
    o = options()
    if not o.native:
        return "HOT_FAST_NATIVE=0"
    if o.interpret:
        return "the Triton interpreter runs the kernels"
    if not fixed_tile():
        return "HOT_FAST_AUTOTUNE=1 (autotuned kernels launch through Triton)"
    if module() is None:
        return "the extension hot.fast._C is not loaded or predates native launches"
    return _STATE.get("why")


@on_change
def forget() -> None:
    """Forget registrations: plans are rebuilt when the options change."""
    with _LOCK:
        _PLANS.clear()
        _COMPILED.clear()
        _STATE.clear()


def _off_reason(k, nargs: int) -> Optional[str]:
    """Why compiled kernel k cannot be launched natively with nargs runtime arguments, or None."""
    md = k.metadata
    if getattr(k, "function", None) is None:
        return "the kernel is not loaded"
    if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
        return "the kernel needs scratch memory"
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False) \
            or getattr(md, "launch_pdl", False):
        return "the kernel needs launch attributes (clusters, cooperative or PDL launch)"
    kinds = kinds_of(k.src.signature)
    if kinds is None:
        return f"argument types {list(k.src.signature.values())} have no native launch"
    if len(kinds) < nargs or set(kinds[nargs:]) - {"c"}:
        return f"argument kinds {kinds!r} do not match the {nargs} runtime arguments"
    return None


def _register_kernel(mod, k, nargs: int) -> int:
    why = _off_reason(k, nargs)
    if why is not None:
        raise RuntimeError(why)
    ret = mod.register_triton(int(k.function), 32 * int(k.metadata.num_warps),
                              int(k.metadata.shared), kinds_of(k.src.signature))
    return int(_ext.result_or_raise(ret))


def register(p: PassPlan, x: torch.Tensor, stats_k, quantize_k, nargs: tuple[int, int]) -> None:
    """After a Python launch of plan p over x (stats_k, quantize_k: the compiled kernels it ran,
    nargs: how many runtime arguments each took): make the plan's later passes native, or never."""
    key = (p.uid, x.data_ptr() % 16 == 0)
    if key in _PLANS or why_off() is not None or (stats_k is None and not p.rows) \
            or quantize_k is None or callable(p.grid):
        return
    mod = module()
    with _LOCK:
        if key in _PLANS:
            return
        if p.rows and not getattr(mod, "one_kernel_passes", False):
            _PLANS[key] = False  # an older build launches two kernels a pass: Python launches it
            return
        try:
            # A rows plan has no stats kernel: id -1 (csrc/binding.cpp run_pass skips it).
            ids = (-1 if p.rows else _register_kernel(mod, stats_k, nargs[0]),
                   _register_kernel(mod, quantize_k, nargs[1]))
        except Exception as e:  # the Python path stays correct; say why once
            _STATE.setdefault("why", f"registration failed: {type(e).__name__}: {e}")
            _PLANS[key] = False
            return
        _COMPILED[key] = (stats_k, quantize_k)
        _PLANS[key] = NativePlan(ids[0], ids[1], *p.grid, x.shape[0], x.shape[1], p.c16, p.lr,
                                 p.l16 // 16, p.nh, p.nl, p.hq_spad, p.hla_spad, int(p.do_hq),
                                 int(p.do_hla), int(p.bsum))


def plan(p: PassPlan, x: torch.Tensor) -> Optional[NativePlan]:
    """The registered native plan of p for x's alignment, or None (falsy: not registered)."""
    return _PLANS.get((p.uid, x.data_ptr() % 16 == 0)) if options().native else None


def quant_pass(x: torch.Tensor, p: PassPlan, hq: Optional[HQArgs],
               hla: Optional[HLAArgs]) -> Optional[PassOutputs]:
    """hot.fast.quantize.run_pass(x, p, hq, hla) in one C++ call; None when the plan is not
    registered."""
    cp = plan(p, x)
    if not cp:
        return None
    CALLS["quant_pass"] += 1
    out = _ext.result_or_raise(module().quant_pass(
        list(cp), x, pass_workspace(p, x.device), key_arg(hq.seed) if hq else 0,
        key_arg(hla.seed) if hla else 0, draw_arg(hla), step_counter(hq, hla)))
    return PassOutputs(*out)


# The C++ pass launch, behind hot.fast.quantize.run_pass.
ROUTE = PassRoute(run=quant_pass, adopt=register)

_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def layer_backward(pg: PassPlan, pw: PassPlan, cg: NativePlan, cw: NativePlan, gy: torch.Tensor,
                   wt: torch.Tensor, qx: torch.Tensor, sx: torch.Tensor, hq: HQArgs,
                   hla: HLAArgs, hq_w: HQArgs, step: Optional[torch.Tensor], gemm_kind: int,
                   gx_dtype: torch.dtype, gw_dtype: torch.dtype):
    """[g_x, g_W, g_b or None] of one layer from the registered plans cg (g_y) and cw (W^T) in
    one C++ call (csrc/binding.cpp layer_backward); ``step``: the counter the seeds follow."""
    CALLS["layer_backward"] += 1
    # One zeroed vector for both passes' maxima: one memset. The W pass's part starts on a
    # 16-byte boundary, as the fresh vector of its first (Python) launch did: the compiled
    # kernel may assume that alignment of its pointer arguments.
    ng = (pg.amax_entries + 3) // 4 * 4
    amax = absmax_workspace(gy.device, ng + pw.amax_entries)
    return _ext.result_or_raise(module().layer_backward(
        list(cg), list(cw), gy, wt, qx, sx, amax[:ng], amax[ng:], key_arg(hq.seed),
        key_arg(hla.seed), draw_arg(hla), key_arg(hq_w.seed), step, gemm_kind, _DT[gx_dtype],
        _DT[gw_dtype]))
