"""The reference backend: the executable specification of HOT's operations in plain PyTorch.

Each function computes exactly what ``hot.common.ops`` documents, on CPU or GPU, with real
integer codes (int8 tensors) and a floating-point GEMM that is exact for them (see
``int_gemm_nt``). Readable first; speed is the fast backend's job. It registers as the default
implementation of every operation (hot.common.ops.DEFAULT).
"""

from __future__ import annotations

import torch

from ..common import ops, quant
from ..common.backend import Backend, register_backend
from ..common.ops import HLAArgs, HQArgs, Quantized
from ..common.config import DRAWN_SELECTIONS
from ..common.transforms import compute_dtype, drawn_transform, hla_transform, hq_transform


def _finish(t: torch.Tensor, bits: int, scale_mode, stochastic: bool, seed: int,
            scale: "torch.Tensor | None" = None) -> Quantized:
    """t's codes (``scale``: the groups' scales where they are not t's absmax ones)."""
    if bits == 0:
        return Quantized(t, torch.ones((t.shape[0] if scale_mode == ops.ScaleMode.ROW else 1, 1),
                                       dtype=torch.float32, device=t.device))
    return Quantized(*quant.quantize(t, bits, ops.ScaleMode(scale_mode).value, stochastic,
                                     quant.seed_value(seed) if stochastic else 0, scale))


def hq_quantize(x: torch.Tensor, a: HQArgs) -> Quantized:
    return _finish(hq_transform(x), a.bits, a.scale_mode, a.stochastic, a.seed)


def hla_quantize(x: torch.Tensor, a: HLAArgs) -> Quantized:
    if a.selection in DRAWN_SELECTIONS:
        if a.draw is None:
            raise ValueError(f"hla_quantize: selection {a.selection!r} needs HLAArgs.draw")
        t, amax = drawn_transform(x, a.rank, quant.seed_value(a.draw))
        scale = None
        if a.bits:  # quant.absmax_scale of all 16 weighted rows (per column, or per tensor)
            amax = amax.to(torch.float32).reshape(-1, 1)
            if ops.ScaleMode(a.scale_mode) == ops.ScaleMode.TENSOR:
                amax = amax.amax().reshape(1, 1)
            scale = quant.amax_scale(amax, a.bits)
        return _finish(t, a.bits, a.scale_mode, a.stochastic, a.seed, scale)
    t = hla_transform(x, a.rank, a.selection)
    if a.history is None:
        return _finish(t, a.bits, a.scale_mode, a.stochastic, a.seed)
    amax = quant.absmax(t, "row")
    hist = a.history.reshape(-1, 1)
    out = _finish(t, a.bits, a.scale_mode, a.stochastic, a.seed,
                  quant.delayed_scale(amax, hist, a.bits))
    hist.copy_(amax)
    return out


def plain_quantize(x: torch.Tensor, a: HQArgs) -> Quantized:
    # in the transforms' compute dtype, as hq_quantize's quantizer sees its input
    return _finish(x.to(compute_dtype(x)), a.bits, a.scale_mode, a.stochastic, a.seed)


LUQ_MAGNITUDES = 7  # 4-bit LUQ: a sign and the codes 0, 2^0 .. 2^6


def luq_quantize(x: torch.Tensor, a: HQArgs) -> Quantized:
    t = x.to(compute_dtype(x))
    top = float(1 << (LUQ_MAGNITUDES - 1))
    dims = (1,) if a.scale_mode == ops.ScaleMode.ROW else (0, 1)
    amax = t.abs().amax(dim=dims, keepdim=True).to(torch.float32).reshape(-1, 1)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    v = (t.abs() / (scale if a.scale_mode == ops.ScaleMode.ROW else scale.reshape(()))
         ).to(torch.float32)
    u = (quant.uniform(quant.seed_value(a.seed), tuple(t.shape), device=t.device)
         if a.stochastic else torch.full_like(v, 0.5))
    # v = m * 2^e with m in [0.5, 1): the power of two below v is 2^(e - 1), exactly
    lo = torch.ldexp(torch.ones_like(v), torch.frexp(v).exponent - 1).clamp_(max=top)
    up = torch.where(v < 1, u < v, u < (v - lo) / lo)
    code = torch.where(v < 1, up.to(v.dtype), torch.where(up, 2 * lo, lo)).clamp_(max=top)
    q = (code * torch.sign(t).to(v.dtype)).to(torch.int8)
    if quant.may_be_nonfinite(amax):
        q = torch.where(torch.isfinite(v), q, torch.zeros_like(q))
    return Quantized(q, scale)


def _absmax_int(t: torch.Tensor) -> int:
    # aminmax on the int8 codes themselves: abs() of int8 -128 would overflow.
    if t.numel() == 0:
        return 0
    lo, hi = torch.aminmax(t)
    return max(-int(lo), int(hi))


_F32_EXACT = 1 << 24  # every integer of magnitude below 2^24 is a float32


# torch._int_mm on the CPU returns wrong values (uninitialised memory) for a contraction of
# length 1 with contiguous operands, for every M and every N >= 2 (measured on torch 2.14, an
# AVX-512 CPU; K = 0 and every K >= 2 are exact, with any M, N and either operand layout). Such
# products take the float path, exact for them.
_INT_MM_MIN_K = 2

# Longest contraction whose int32 sum of int8 products cannot overflow: K * 128^2 <= 2^31 - 1.
_I32_CHUNK = ((1 << 31) - 1) // (128 * 128)


def _int_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b^T of int8 codes, the exact integer result rounded once to float32.

    On CPU: the integer GEMM (torch._int_mm, int32 sums) over chunks of K short enough that no
    int32 sum can overflow and never of one column (_INT_MM_MIN_K), chunk sums added in
    int64: exact by construction, 1.1-4x faster than
    the float path on the demo's shapes. Elsewhere a float32 GEMM, exact when every partial sum
    is an integer below 2^24, i.e. when the contraction length times max|a| max|b| is. Longer
    contractions (HLA's INT8 g_W GEMM): on CUDA one float64 GEMM (no host reads: CUDA graphs
    and busy GPUs); elsewhere chunks that each meet the bound, the chunk results summed in
    float64 (exact below 2^53)."""
    if a.device.type == "cpu" and hasattr(torch, "_int_mm") and a.shape[1] >= _INT_MM_MIN_K:
        return _int_product_i32(a, b)
    if a.device.type == "cuda":
        # No host read of the codes' range (the chunked path syncs twice per GEMM): int8 codes
        # are at most 128 in magnitude, so a float32 GEMM is exact up to 1023 terms, and a
        # float64 one for any contraction below 2^53 / 128^2.
        if a.shape[1] * 128 * 128 < _F32_EXACT:
            return a.to(torch.float32) @ b.to(torch.float32).t()
        return _int_product_f64(a, b)
    return _int_product_f32(a, b)


def _int_product_i32(a: torch.Tensor, b: torch.Tensor, chunk: int = _I32_CHUNK) -> torch.Tensor:
    bt = b.t()
    k = a.shape[1]
    if k <= chunk:
        return torch._int_mm(a, bt).to(torch.float32)
    bounds = list(range(0, k, chunk)) + [k]
    if k - bounds[-2] < _INT_MM_MIN_K:  # a one-column last chunk: one column more for it
        bounds[-2] -= 1
    acc = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.int64, device=a.device)
    for k0, k1 in zip(bounds, bounds[1:]):
        acc += torch._int_mm(a[:, k0:k1], bt[k0:k1])
    return acc.to(torch.float32)


def _int_product_f64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.to(torch.float64) @ b.to(torch.float64).t()).to(torch.float32)


def _int_product_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[1]
    per_term = _absmax_int(a) * _absmax_int(b)
    chunk = (_F32_EXACT - 1) // per_term if per_term else k
    af, bf = a.to(torch.float32), b.to(torch.float32)
    if chunk >= k:
        return af @ bf.t()
    acc = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.float64, device=a.device)
    for k0 in range(0, k, chunk):
        acc += af[:, k0:k0 + chunk] @ bf[:, k0:k0 + chunk].t()
    return acc.to(torch.float32)


def int_gemm_nt(a, b, sa, sb, out_dtype, bias=None):
    """(a @ b^T) * sa * sb^T + bias. Integer codes: exactly
        out[m, n] = cvt(((float32(sum_k a[m, k] b[n, k]) * sa[m]) * sb[n]) + bias[n])
    with the exact integer product rounded once to float32 (``_int_product``), each float32
    operation rounded to nearest in this order (the kernels' epilogue order) and cvt one
    rounding into out_dtype: the bias (float32, N values; hot.common.ops.check_bias) is added
    before the single rounding of the result. Float operands: a float GEMM, acc * sa * sb^T +
    bias in its dtype (float64 when an operand is, else float32). bias=None adds nothing."""
    if a.dtype == torch.int8 and b.dtype == torch.int8:
        out = _int_product(a, b).mul_(sa).mul_(sb.t())  # (acc * sa) * sb^T, the kernels' order
        if bias is not None:
            out.add_(bias.to(torch.float32))  # in float32, before the one rounding below
    else:
        dt = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
        acc = a.to(dt) @ b.to(dt).t()
        out = acc * sa.to(dt) * sb.to(dt).t()
        if bias is not None:
            out.add_(bias.to(dt))
    return out.to(out_dtype)


for _name, _fn in (("hq_quantize", hq_quantize), ("hla_quantize", hla_quantize),
                  ("plain_quantize", plain_quantize), ("luq_quantize", luq_quantize),
                  ("int_gemm_nt", int_gemm_nt)):
    ops.register(_name, ops.DEFAULT, _fn)
register_backend(Backend(ops.DEFAULT, why_unavailable=lambda device: None))
