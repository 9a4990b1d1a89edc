"""The fast backend: Triton transform/quantize kernels and integer GEMMs for Ampere/Ada and Hopper.

Operations (same function as hot.reference, see hot.common.ops):
    hq_quantize, hla_quantize  -> hot.fast.quant (Triton; hash-stream stochastic rounding)
    gy_quantize (fused g_y)    -> hot.fast.quant.gy_quantize (both operands from one pass)
    int_gemm_nt                -> hot.fast.gemm (CUTLASS when built, else Triton int8, fused dequant)
    fused_backward             -> hot.fast.native (both passes and GEMMs of a layer in one C++ call)
Kernels are imported on first use, so importing this package never needs a GPU; why_unavailable
says in plain words why a device cannot run them.
"""

from __future__ import annotations

from ..common.backend import Backend, register_backend
from . import arch, gemm, native, quant

why_unavailable = arch.why_unavailable

BACKEND = Backend("fast", quant.hq_quantize, quant.hla_quantize, gemm.int_gemm_nt, why_unavailable)
# The optional fused g_y operation (hot.common.ops.gy_quantize looks for this attribute).
BACKEND.gy_quantize = quant.gy_quantize
# The optional one-call layer backward (hot.common.ops, fused_backward; hot.fast.native).
BACKEND.fused_backward = native.fused_backward
register_backend(BACKEND)
