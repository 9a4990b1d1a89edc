"""The three backend operations of HOT, declared once with torch.library.

Every backend implements exactly these; the autograd function composes them and nothing else,
so two backends can be compared operation by operation. Fake (meta) implementations give the
output shapes, so torch.compile can trace through them.

Shared conventions: block = 16; ``bits = 0`` means "no quantization" (q is float32 and scale is
ones); ``scale_mode`` is 'row' (one scale per output row) or 'tensor' (one scale); ``seed`` feeds
the counter-based stream of ``hot.common.quant.uniform`` over the row-major index of q.

hq_quantize(x (R, C), bits, scale_mode, stochastic, seed) -> q (R, C16), scale (R|1, 1)
    C16 = C rounded up to a multiple of 16 (zero columns). With H = hadamard16() on each block
    of 16 consecutive columns:  q * scale ~= pad(x) @ (I (x) H).
    Used for g_y (R = tokens, C = O: scale per token or per tensor) and for W^T (R = I, C = O:
    scale per input channel), so both scales are constant along the contracted dimension O.

hla_quantize(x (L, C), rank, selection, bits, scale_mode, stochastic, seed) -> q (C, Lr), scale (C|1, 1)
    L16 = L rounded up to a multiple of 16 (zero rows), Lr = L16 / 16 * rank. With T_r =
    hla_matrix(rank, selection) on each block of 16 consecutive rows:
    q * scale ~= ((I (x) T_r) pad(x))^T, i.e. q[c, j*rank + t] ~ sum_i T_r[t, i] x[16 j + i, c].
    Used for g_y (C = O) in backward and for x (C = I) in forward (ABC saves this q).

int_gemm_nt(a (M, K), b (N, K), sa (M|1, 1), sb (N|1, 1), out_dtype) -> (M, N)
    (a @ b^T) * sa * sb^T, with the integer products accumulated exactly.

gy_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection, hla_bits,
            hla_scale_mode, hla_stochastic, hla_seed) -> (hq_q, hq_scale, hla_q, hla_scale)
    The fused g_y pass, by definition exactly
    (*hq_quantize(x, hq_bits, ...), *hla_quantize(x, rank, selection, hla_bits, ...)):
    a backend may compute both from one read of x (its ``gy_quantize`` attribute); one that has
    none runs the two operations.

fused_backward(gy, wt, qx, sx, hq, hla, hq_w, gx_dtype, gw_dtype, need_gb) -> (g_x, g_W, g_b) or None
    An optional backend attribute (not a torch.library op; eager only): one layer's HOT backward
    in one call, by definition exactly
        q1, s1, q2, s2 = gy_quantize(gy, *hq, *hla);  qw, sw = hq_quantize(wt, *hq_w)
        (int_gemm_nt(q1, qw, s1, sw, gx_dtype), int_gemm_nt(q2, qx, s2, sx, gw_dtype))
    with hq = (bits, scale_mode, stochastic, seed), hla = (rank, selection, bits, scale_mode,
    stochastic, seed); g_b = gy.sum(0) (float32 accumulation, any order, in gy's dtype) when
    need_gb and the backend forms it on the way, else None (the caller sums). None means "not in
    one call for these arguments": the caller composes the operations. The fast backend has it
    to save host time and a read of g_y (hot.fast.native).
"""

from __future__ import annotations

import torch

from .backend import get_backend
from .config import BLOCK

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}


def pad_to(n: int, m: int = BLOCK) -> int:
    return (n + m - 1) // m * m


def _q_dtype(bits: int, x: torch.Tensor) -> torch.dtype:
    if bits:
        return torch.int8
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _hq_quantize(x, bits, scale_mode, stochastic, seed, backend):
    return get_backend(backend).hq_quantize(x, bits, scale_mode, stochastic, seed)


@torch.library.custom_op("hot::hq_quantize", mutates_args=())
def hq_quantize(
    x: torch.Tensor, bits: int, scale_mode: str, stochastic: bool, seed: int, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    return _hq_quantize(x, bits, scale_mode, stochastic, seed, backend)


@hq_quantize.register_fake
def _(x, bits, scale_mode, stochastic, seed, backend):
    r, c = x.shape
    q = x.new_empty((r, pad_to(c)), dtype=_q_dtype(bits, x))
    s = x.new_empty((r if scale_mode == "row" else 1, 1), dtype=torch.float32)
    return q, s


@torch.library.custom_op("hot::hla_quantize", mutates_args=())
def hla_quantize(
    x: torch.Tensor,
    rank: int,
    selection: str,
    bits: int,
    scale_mode: str,
    stochastic: bool,
    seed: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed, backend)


def _hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed, backend):
    return get_backend(backend).hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed)


@hla_quantize.register_fake
def _(x, rank, selection, bits, scale_mode, stochastic, seed, backend):
    length, c = x.shape
    q = x.new_empty((c, pad_to(length) // BLOCK * rank), dtype=_q_dtype(bits, x))
    s = x.new_empty((c if scale_mode == "row" else 1, 1), dtype=torch.float32)
    return q, s


@torch.library.custom_op("hot::int_gemm_nt", mutates_args=())
def int_gemm_nt(
    a: torch.Tensor,
    b: torch.Tensor,
    sa: torch.Tensor,
    sb: torch.Tensor,
    out_dtype: str,
    backend: str,
) -> torch.Tensor:
    return _int_gemm_nt(a, b, sa, sb, out_dtype, backend)


def _int_gemm_nt(a, b, sa, sb, out_dtype, backend):
    return get_backend(backend).int_gemm_nt(a, b, sa, sb, _DTYPES[out_dtype])


@int_gemm_nt.register_fake
def _(a, b, sa, sb, out_dtype, backend):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=_DTYPES[out_dtype])


def dtype_name(dtype: torch.dtype) -> str:
    for k, v in _DTYPES.items():
        if v == dtype:
            return k
    raise ValueError(f"unsupported dtype {dtype}")


@torch.library.custom_op("hot::gy_quantize", mutates_args=())
def gy_quantize(
    x: torch.Tensor,
    hq_bits: int,
    hq_scale_mode: str,
    hq_stochastic: bool,
    hq_seed: int,
    rank: int,
    selection: str,
    hla_bits: int,
    hla_scale_mode: str,
    hla_stochastic: bool,
    hla_seed: int,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _gy_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection,
                        hla_bits, hla_scale_mode, hla_stochastic, hla_seed, backend)


def _gy_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection, hla_bits,
                 hla_scale_mode, hla_stochastic, hla_seed, backend):
    b = get_backend(backend)
    fused = getattr(b, "gy_quantize", None)
    if fused is not None:
        return fused(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection,
                     hla_bits, hla_scale_mode, hla_stochastic, hla_seed)
    q1, s1 = b.hq_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed)
    q2, s2 = b.hla_quantize(x, rank, selection, hla_bits, hla_scale_mode, hla_stochastic, hla_seed)
    return q1, s1, q2, s2


@gy_quantize.register_fake
def _(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection, hla_bits,
      hla_scale_mode, hla_stochastic, hla_seed, backend):
    r, c = x.shape
    q1 = x.new_empty((r, pad_to(c)), dtype=_q_dtype(hq_bits, x))
    s1 = x.new_empty((r if hq_scale_mode == "row" else 1, 1), dtype=torch.float32)
    q2 = x.new_empty((c, pad_to(r) // BLOCK * rank), dtype=_q_dtype(hla_bits, x))
    s2 = x.new_empty((c if hla_scale_mode == "row" else 1, 1), dtype=torch.float32)
    return q1, s1, q2, s2


def _direct(op, impl):
    """``impl`` called straight in eager mode; the torch.library ``op`` under tracing."""

    def call(*args):
        return op(*args) if torch.compiler.is_compiling() else impl(*args)

    return staticmethod(call)


class _Direct:
    """The same operations without the torch.library dispatcher, which costs 20-40 us a call.

    HOT layers run outside torch.compile tracing (their state changes every call), so eager code
    gains nothing from the dispatcher; under tracing these still route through torch.ops.hot.
    """

    hq_quantize = _direct(hq_quantize, _hq_quantize)
    hla_quantize = _direct(hla_quantize, _hla_quantize)
    int_gemm_nt = _direct(int_gemm_nt, _int_gemm_nt)
    gy_quantize = _direct(gy_quantize, _gy_quantize)


direct = _Direct()


def fused_backward(backend: str):
    """The backend's fused_backward (module docstring), or None: under tracing, or where the
    backend has none."""
    if torch.compiler.is_compiling():
        return None
    return getattr(get_backend(backend), "fused_backward", None)
