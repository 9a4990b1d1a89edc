"""Native launches: a quantizer pass, and a whole layer backward, as one C++ call each.

Why: on the H100 machines a layer backward cost ~0.4 ms of host time in Python (two passes of two
Triton launches, two GEMM bindings, their argument handling) against tens of microseconds of GPU
work for ViT-sized layers, so small layers and whole training steps waited on the host
(docs/performance.md, Round 4).

How: hot.fast.quant launches its Triton kernels through launch.Direct; the first pass of a plan
compiles and loads them (and runs in Python). ``register`` then hands both loaded kernels to the
extension (csrc/triton_launch.h: their CUfunction, block size, shared memory and argument kinds,
checked there against the cubin's own parameter list), and later passes of that plan run in C++
(csrc/binding.cpp ``run_pass``: the same outputs and arguments as hot.fast.quant.pass_args).

    quant_pass(x, p, hq, hla)  -> (hq_q, hq_s, hla_q, hla_s), or None (then Python launches)
        the same outputs as hot.fast.quant.gy_pass for plan p, from one C++ call.
    fused_backward(gy, wt, qx, sx, hq, hla, hq_w, gx_dtype, gw_dtype, need_gb) -> (g_x, g_W, g_b)
        the fast backend's one-call layer backward (hot.common.ops, "fused_backward"): the fused
        g_y pass (with the bias gradient's column sums when asked), the HQ pass over W^T and
        both CUTLASS GEMMs. None where it cannot run this case exactly as the composed
        operations would (no extension or registration, a GEMM that would not be a CUTLASS int8
        GEMM); the caller then composes the operations.

Off under the Triton interpreter, with HOT_FAST_AUTOTUNE=1 (autotuned kernels are not one fixed
compiled kernel), with HOT_FAST_NATIVE=0, and where the extension or a registration fails;
``why_off()`` says why.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Optional

import torch

from . import quant
from .arch import AUTOTUNE, INTERPRET, arch_for

ENABLED = os.environ.get("HOT_FAST_NATIVE", "1").strip() not in ("", "0")

_LOCK = threading.Lock()
_PLANS: dict = {}  # (pass plan uid, x 16-byte aligned) -> C++ plan (list of ints) or False
_COMPILED: dict = {}  # the same keys -> (stats kernel, quantize kernel) as Triton compiled them
_STATE: dict = {}  # "why": the first reason registration failed
# How many passes and layer backwards ran natively (benchmarks and tests read it).
CALLS = {"quant_pass": 0, "fused_backward": 0}

# Triton signature types -> csrc/triton_launch.h argument kinds.
_KINDS = {"i32": "i", "i64": "l", "constexpr": "c"}


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


def _module():
    from .gemm import _ext

    e = _ext()
    m = e.load() if e is not None else None
    return m if m is not None and hasattr(m, "layer_backward") else None


def why_off() -> Optional[str]:
    """None when native launches are in use, else why not."""
    if not ENABLED:
        return "HOT_FAST_NATIVE=0"
    if INTERPRET:
        return "the Triton interpreter runs the kernels"
    if AUTOTUNE:
        return "HOT_FAST_AUTOTUNE=1 (autotuned kernels launch through Triton)"
    if _module() is None:
        return "the extension hot.fast._C is not loaded or predates native launches"
    return _STATE.get("why")


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
    from ._ext import result_or_raise

    ret = mod.register_triton(int(k.function), 32 * int(k.metadata.num_warps), int(k.metadata.shared),
                              kinds_of(k.src.signature))
    _, err = ret
    if err:
        result_or_raise((None, err))
    return int(ret[0])


def register(p: dict, x: torch.Tensor, stats_k, quant_k, nargs: tuple[int, int]) -> None:
    """After a Python launch of plan p over x (stats_k, quant_k: the compiled kernels it ran,
    nargs: how many runtime arguments each took): make the plan's later passes native, or never."""
    key = (p["uid"], x.data_ptr() % 16 == 0)
    if key in _PLANS or why_off() is not None or stats_k is None or quant_k is None:
        return
    grid = p["grid"]
    if callable(grid):
        return
    mod = _module()
    with _LOCK:
        if key in _PLANS:
            return
        try:
            ids = (_register_kernel(mod, stats_k, nargs[0]), _register_kernel(mod, quant_k, nargs[1]))
        except Exception as e:  # the Python path stays correct; say why once
            _STATE.setdefault("why", f"registration failed: {type(e).__name__}: {e}")
            _PLANS[key] = False
            return
        _COMPILED[key] = (stats_k, quant_k)
        g = tuple(grid) + (1,) * (3 - len(grid))
        sw = p["sw"].kw
        _PLANS[key] = [ids[0], ids[1], *g, x.shape[0], x.shape[1], p["c16"], p["lr"], p["l16"] // 16,
                       p["nh"], p["nl"], p["hq_spad"], p["hla_spad"], int(sw["DO_HQ"]), int(sw["DO_HLA"]),
                       int(p["bsum"])]


def _plan(p: dict, x: torch.Tensor):
    return _PLANS.get((p["uid"], x.data_ptr() % 16 == 0)) if ENABLED else None


def quant_pass(x: torch.Tensor, p: dict, hq: Optional[tuple], hla: Optional[tuple]):
    """hot.fast.quant.gy_pass(x, hq, hla, bsum=p["bsum"]) for plan p in one C++ call, as
    (hq_q, hq_s, hla_q, hla_s, bsum or None); None when the plan is not registered."""
    cp = _plan(p, x)
    if not cp:
        return None
    from ._ext import result_or_raise

    CALLS["quant_pass"] += 1
    amax, epoch = quant._WS.take(x.device, p["nh"] + p["nl"] + 1)
    out = result_or_raise(_module().quant_pass(
        cp, x, p["h16"], p["t"], amax, epoch, quant._key(hq[3]) if hq else 0,
        quant._key(hla[5]) if hla else 0))
    return tuple(out)


_DT = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@functools.lru_cache(maxsize=1024)
def _gemm_kind_of(dev: torch.device, k_gx: int, k_gw: int, hq_bits: int) -> Optional[int]:
    from . import gemm

    arch = arch_for(dev)
    s4, s8 = gemm._ext_caps(dev, arch)
    if not s8 or k_gx % 16 or k_gw % 16 or max(k_gx, k_gw) > s8:
        return None
    if arch == "sm80" and s4 and hq_bits <= 4:
        return None  # the composed path packs 4-bit codes for the int4 GEMM there
    return 0 if arch == "sm90" else 1


def _gemm_kind(dev: torch.device, k_gx: int, k_gw: int, qx: torch.Tensor, hq_bits: int) -> Optional[int]:
    """0 (CUTLASS SM90 int8) or 1 (CUTLASS SM80 int8) where hot.fast.gemm.int_gemm_nt would run
    that GEMM for both products of this backward, else None (the composed path then runs)."""
    from .gemm import _ext_ok

    return _gemm_kind_of(dev, k_gx, k_gw, hq_bits) if _ext_ok(qx, 16) else None


def fused_backward(gy, wt, qx, sx, hq: tuple, hla: tuple, hq_w: tuple, gx_dtype: torch.dtype,
                   gw_dtype: torch.dtype, need_gb: bool = False):
    """(g_x, g_W, g_b) of one layer in one C++ call (module docstring), or None.

    hq = (bits, scale_mode, stochastic, seed) for g_y's HQ operand, hla = (rank, selection, bits,
    scale_mode, stochastic, seed) for its HLA operand, hq_w = HQ of W^T; qx, sx = ABC's saved
    operand. Exactly (int_gemm_nt(q_gy, q_w, s_gy, s_w), int_gemm_nt(q_hla, qx, s_hla, sx)) with
    (q_gy, s_gy, q_hla, s_hla) = gy_quantize(gy, *hq, *hla) and (q_w, s_w) = hq_quantize(wt, *hq_w).
    g_b: with need_gb, the column sums of gy in gy's dtype (float32 sums formed by the g_y pass's
    stats kernel, quant.gy_pass bsum=True), else None (also where the kernel cannot form them).

    The first call for a pair of plans launches them in Python (which registers them) and
    composes the GEMMs; later calls are one C++ call."""
    if (gy.dtype not in _DT or wt.dtype not in _DT or gx_dtype not in _DT or gw_dtype not in _DT
            or gy.numel() == 0 or wt.numel() == 0 or not hq[0] or not hla[2] or not hq_w[0]
            or gy.device.type != "cuda" or sx.dtype != torch.float32 or not ENABLED):
        return None
    bsum = need_gb and quant.bsum_capable()
    pg = quant.plan_for(gy, hq, hla, bsum)
    pw = quant.plan_for(wt, hq_w, None)
    kind = _gemm_kind(gy.device, pg["c16"], pg["lr"], qx, hq[0])
    if kind is None or qx.shape[1] != pg["lr"] or pw["c16"] != pg["c16"]:
        return None
    cg, cw = _plan(pg, gy), _plan(pw, wt)
    if not cg or not cw:
        if why_off() is not None:
            return None
        # This pair of plans has not run yet: launch it in Python (which registers it) and
        # compose; int_gemm_nt runs the same CUTLASS GEMM (_gemm_kind) as layer_backward would.
        from .gemm import int_gemm_nt

        outs = quant.gy_pass(gy, hq, hla, bsum)
        qw, sw, _, _ = quant.gy_pass(wt, hq_w, None)
        gx = int_gemm_nt(outs[0], qw, outs[1], sw, gx_dtype)
        gw = int_gemm_nt(outs[2], qx, outs[3], sx, gw_dtype)
        return gx, gw, (outs[4].to(gy.dtype) if bsum else None)
    from ._ext import result_or_raise

    CALLS["fused_backward"] += 1
    dev = gy.device
    amax_g, eg = quant._WS.take(dev, pg["nh"] + pg["nl"] + 1)
    amax_w, ew = quant._WS.take(dev, pw["nh"] + 1)
    gx, gw, gb = result_or_raise(_module().layer_backward(
        cg, cw, gy, wt, qx, sx, pg["h16"], pg["t"], pw["t"], amax_g, eg, amax_w, ew,
        quant._key(hq[3]), quant._key(hla[5]), quant._key(hq_w[3]), kind, _DT[gx_dtype], _DT[gw_dtype]))
    return gx, gw, gb
