"""The forward GEMM of a HOT layer with HOTConfig(forward="int8"): HQ applied to the forward.

For a layer y = x W^T + b with tokens flattened to rows (x: L x I, W: O x I) and H the
16-point block Walsh-Hadamard transform along the input channels (orthonormal, so
(x H)(W H)^T = x W^T):

    q_x, s_x = hq_quantize(x)     per-token scales, round to nearest, 8 bits   (L x I16)
    q_w, s_w = hq_quantize(W)     per-output-channel scales, the same          (O x I16)
    y        = int_gemm_nt(q_x, q_w, s_x, s_w, bias=float32(b))
             = cvt(((float32(q_x q_w^T) * s_x) * s_w^T) + float32(b))

Both scales are constant along the contracted dimension I, so the integer GEMM applies them in
its epilogue (the same operations, kernels and GEMM as the backward's g_x path), and the bias
with them: added in float32 before the one rounding into y's dtype, it needs no pass of its own
over y. The bias enters as the layer passes it (under autocast cast to the autocast dtype, as
nn.Linear's is), widened to float32. Where the
forward also keeps ABC's codes of x, one pass over x forms both (``gy_quantize``: by definition
the pair of hq_quantize and hla_quantize), so x is read once. docs/algorithm.md §5b gives the
error this adds. The backward is the exact product's (straight-through): nothing here changes
what backward receives.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..common import ops
from ..common.ops import HLAArgs, HQArgs, Quantized, ScaleMode

FORWARD_BITS = {"int8": 8}  # HOTConfig.forward -> the codes' width

# Round to nearest: the forward's error enters the loss once, not as a gradient averaged over
# steps, so the unbiased (stochastic) rounding the backward needs would only add variance.
_NEAREST_SEED = 0


def forward_args(mode: str) -> HQArgs:
    """hq_quantize's arguments for both operands of a quantized forward: per row (x: per
    token; W: per output channel), round to nearest."""
    return HQArgs(FORWARD_BITS[mode], ScaleMode.ROW, False, _NEAREST_SEED)


def quantized_gemm(mode: str, rows: torch.Tensor, w2d: torch.Tensor, b: Optional[torch.Tensor],
                   backend: str, abc: Optional[HLAArgs] = None
                   ) -> tuple[torch.Tensor, Optional[Quantized]]:
    """(y = rows W^T + b from the quantized operands, in rows' dtype; ABC's codes of rows with
    ``abc`` when given, from the same pass over rows, else None). y equals
    coded_gemm(mode, row_codes(mode, rows, backend, abc)[0], w2d, b, backend, rows.dtype)."""
    qx, codes = row_codes(mode, rows, backend, abc)
    return coded_gemm(mode, qx, w2d, b, backend, rows.dtype), codes


def row_codes(mode: str, rows: torch.Tensor, backend: str, abc: Optional[HLAArgs] = None
              ) -> tuple[Quantized, Optional[Quantized]]:
    """(x's codes for the forward GEMM; ABC's codes of rows from the same pass with ``abc``,
    else None): the pass over x, apart from the GEMM so that layers reading one x can share
    it (HLAConfig.share)."""
    a = forward_args(mode)
    if abc is not None:
        return ops.gy_quantize(rows, a, abc, backend)
    return ops.hq_quantize(rows, a, backend), None


def coded_gemm(mode: str, qx: Quantized, w2d: torch.Tensor, b: Optional[torch.Tensor],
               backend: str, dtype: torch.dtype) -> torch.Tensor:
    """y = x W^T + b from x's codes ``qx`` (row_codes) and W's, in ``dtype``: the bias, in
    float32, is added by int_gemm_nt's epilogue before the single rounding of y (no pass of its
    own over y, and no conversion of a float32 parameter)."""
    qw = ops.hq_quantize(w2d, forward_args(mode), backend)
    bias = b.to(torch.float32) if b is not None else None
    return ops.int_gemm_nt(qx.q, qw.q, qx.scale, qw.scale, dtype, backend, bias=bias)

