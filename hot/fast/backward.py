"""The fast backend's layer_backward (hot.common.ops): one layer's HOT backward in one C++ call.

By definition the composition of the operations (the op's docstring): the g_y pass (with the
bias gradient's column sums when asked), the HQ pass over W^T and both CUTLASS int8 GEMMs. None
where one call cannot run this case exactly as the composed operations would: no extension or
registration, or a GEMM that would not be a CUTLASS int8 GEMM; the caller then composes the
operations. The first call for a pair of pass plans is ops.compose_layer_backward with the g_y
operands of this call's own pass plan (launched from Python, which registers the plans with
hot.fast.native); later calls are one C++ call.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ..common.ops import HLAArgs, HQArgs, LayerGrads, Quantized, compose_layer_backward
from ..common.options import BackendName
from . import native
from .arch import arch_for
from .gemm import cutlass_operand_ok, ext_caps
from .passes import bsum_capable, plan_for, step_counter
from .quantize import run_pass

_FAST = BackendName.FAST.value
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SM90, SM80 = 0, 1  # csrc/binding.cpp layer_backward's gemm_kind


@functools.lru_cache(maxsize=1024)
def _gemm_kind(dev: torch.device, k_gx: int, k_gw: int, hq_bits: int) -> Optional[int]:
    """SM90 (CUTLASS SM90 int8) or SM80 (CUTLASS SM80 int8) where hot.fast.gemm.int_gemm_nt
    would run that GEMM for both products of this backward, else None."""
    arch = arch_for(dev)
    s4, s8 = ext_caps(dev, arch)
    if not s8 or k_gx % 16 or k_gw % 16 or max(k_gx, k_gw) > s8:
        return None
    if arch == "sm80" and s4 and hq_bits <= 4:
        return None  # the composed path packs 4-bit codes for the int4 GEMM there
    return SM90 if arch == "sm90" else SM80


def layer_backward(gy: torch.Tensor, wt: torch.Tensor, x_codes: Quantized, hq: HQArgs,
                   hla: HLAArgs, hq_w: HQArgs, gx_dtype: torch.dtype, gw_dtype: torch.dtype,
                   need_gb: bool) -> Optional[LayerGrads]:
    qx, sx = x_codes
    if (gy.dtype not in _DTYPES or wt.dtype not in _DTYPES or gx_dtype not in _DTYPES
            or gw_dtype not in _DTYPES or gy.device.type != "cuda" or sx.dtype != torch.float32
            or native.why_off() is not None):
        return None
    bsum = need_gb and bsum_capable()
    step = step_counter(hq, hla)
    w_step = step_counter(hq_w, None)
    if w_step is not None and w_step is not step:
        raise ValueError("layer_backward: the g_y and W passes must follow the same step counter")
    pg = plan_for(gy, hq, hla, bsum, step is not None)
    pw = plan_for(wt, hq_w, None, False, step is not None)
    kind = _gemm_kind(gy.device, pg.c16, pg.lr, hq.bits) if cutlass_operand_ok(qx) else None
    if kind is None or qx.shape[1] != pg.lr or pw.c16 != pg.c16:
        return None
    cg, cw = native.plan(pg, gy), native.plan(pw, wt)
    if not cg or not cw or pg.delayed is not None:
        # This pair of plans has not run yet: the composed operations, whose Python launches
        # register the plans, and whose int_gemm_nt runs the same CUTLASS GEMM (_gemm_kind) as
        # the C++ call would. g_y's pass runs on pg itself: with the bias sums, pg is not the
        # plan of gy_quantize, and the C++ call needs pg registered. A delayed HLA scale's
        # kernels always launch from Python.
        g = run_pass(gy, pg, hq, hla)
        return compose_layer_backward(gy, wt, x_codes, hq, hla, hq_w, gx_dtype, gw_dtype,
                                      need_gb, _FAST, (Quantized(g.hq_q, g.hq_s),
                                                       Quantized(g.hla_q, g.hla_s)),
                                      g.bsum if bsum else None)
    gx, gw, gb = native.layer_backward(pg, pw, cg, cw, gy, wt, qx, sx, hq, hla, hq_w, step, kind,
                                       gx_dtype, gw_dtype)
    return LayerGrads(gx, gw, gb)
