"""The reference backend: the executable specification of HOT's operations in plain PyTorch.

Each function computes exactly what ``hot.common.ops`` documents, on CPU or GPU, with real
integer codes (int8 tensors) and a floating-point GEMM that is exact for them (see
``int_gemm_nt``). Readable first; speed is the fast backend's job.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ..common import quant
from ..common.backend import Backend, register_backend
from ..common.config import BLOCK
from ..common.ops import pad_to
from ..common.walsh import hadamard16, hla_matrix


@functools.lru_cache(maxsize=None)
def _hadamard(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return hadamard16().to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=None)
def _hla(rank: int, selection: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    # Transposed once here: (16, rank), the right operand of the block product.
    return hla_matrix(rank, selection).t().contiguous().to(device=device, dtype=dtype)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def hq_transform(x: torch.Tensor) -> torch.Tensor:
    """pad(x) @ (I (x) H16) along the last dimension of a 2-D x, in float32 (float64 stays)."""
    dt = _compute_dtype(x)
    r, c = x.shape
    c16 = pad_to(c)
    xp = x.to(dt)
    if c16 != c:
        xp = F.pad(xp, (0, c16 - c))
    h = _hadamard(x.device, dt)
    # One 2-D GEMM over all blocks of 16. For a transposed input (W^T) the reshape copies it
    # once; the batched product on the strided view ran one small GEMM per row on CPU.
    return (xp.reshape(-1, BLOCK) @ h).reshape(r, c16)


def hla_transform(x: torch.Tensor, rank: int, selection: str) -> torch.Tensor:
    """((I (x) T_r) pad(x))^T for a 2-D x (L, C): shape (C, L16 / 16 * rank)."""
    dt = _compute_dtype(x)
    length, c = x.shape
    l16 = pad_to(length)
    xp = x.to(dt)
    if l16 != length:
        xp = F.pad(xp, (0, 0, 0, l16 - length))
    t = _hla(rank, selection, x.device, dt).t()  # (rank, 16)
    # T_r applied to each block of 16 rows as one broadcast batched product on the contiguous
    # (nb, 16, C) view: no copy of the input (a transposed view made CPU bmm ~500x slower).
    coef = torch.matmul(t, xp.reshape(l16 // BLOCK, BLOCK, c))  # (nb, rank, C)
    coef = coef.transpose(1, 2)  # (nb, C, rank)
    return coef.permute(1, 0, 2).reshape(c, l16 // BLOCK * rank)


def _finish(t: torch.Tensor, bits: int, scale_mode: str, stochastic: bool, seed: int):
    if bits == 0:
        return t, torch.ones((t.shape[0] if scale_mode == "row" else 1, 1),
                             dtype=torch.float32, device=t.device)
    return quant.quantize(t, bits, scale_mode, stochastic, seed)


def hq_quantize(x, bits, scale_mode, stochastic, seed):
    return _finish(hq_transform(x), bits, scale_mode, stochastic, seed)


def hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed):
    return _finish(hla_transform(x, rank, selection), bits, scale_mode, stochastic, seed)


def _absmax_int(t: torch.Tensor) -> int:
    # aminmax on the int8 codes themselves: abs() of int8 -128 would overflow.
    if t.numel() == 0:
        return 0
    lo, hi = torch.aminmax(t)
    return max(-int(lo), int(hi))


_F32_EXACT = 1 << 24  # every integer of magnitude below 2^24 is a float32


# Longest contraction whose int32 sum of int8 products cannot overflow: K * 128^2 <= 2^31 - 1.
_I32_CHUNK = ((1 << 31) - 1) // (128 * 128)


def _int_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b^T of int8 codes, the exact integer result rounded once to float32.

    On CPU: the integer GEMM (torch._int_mm, int32 sums) over chunks of K short enough that no
    int32 sum can overflow, chunk sums added in int64: exact by construction, 1.1-4x faster than
    the float path on the demo's shapes. Elsewhere a float32 GEMM, exact when every partial sum
    is an integer below 2^24, i.e. when the contraction length times max|a| max|b| is; longer
    contractions (HLA's INT8 g_W GEMM) are cut into chunks that each meet the bound and the chunk
    results summed in float64 (exact below 2^53)."""
    if a.device.type == "cpu" and hasattr(torch, "_int_mm"):
        return _int_product_i32(a, b)
    return _int_product_f32(a, b)


def _int_product_i32(a: torch.Tensor, b: torch.Tensor, chunk: int = _I32_CHUNK) -> torch.Tensor:
    bt = b.t()
    if a.shape[1] <= chunk:
        return torch._int_mm(a, bt).to(torch.float32)
    acc = torch.zeros((a.shape[0], b.shape[0]), dtype=torch.int64, device=a.device)
    for k0 in range(0, a.shape[1], chunk):
        acc += torch._int_mm(a[:, k0:k0 + chunk], bt[k0:k0 + chunk])
    return acc.to(torch.float32)


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


def int_gemm_nt(a, b, sa, sb, out_dtype):
    """(a @ b^T) * sa * sb^T. Integer codes: the exact integer product rounded once to float32
    (``_int_product``), then scaled in float32; float operands: a float GEMM."""
    if a.dtype == torch.int8 and b.dtype == torch.int8:
        out = _int_product(a, b).mul_(sa).mul_(sb.t())  # (acc * sa) * sb^T, the kernels' order
    else:
        dt = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
        acc = a.to(dt) @ b.to(dt).t()
        out = acc * sa.to(dt) * sb.to(dt).t()
    return out.to(out_dtype)


register_backend(
    Backend(
        name="reference",
        hq_quantize=hq_quantize,
        hla_quantize=hla_quantize,
        int_gemm_nt=int_gemm_nt,
        why_unavailable=lambda device: None,
    )
)
