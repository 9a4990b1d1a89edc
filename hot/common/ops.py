"""HOT's backend operations, each declared once: its exact meaning, its output shapes (the fake
implementation that tracing uses) and the cases every backend hands to the default one.

A backend only registers implementations (``register``); the reference backend registers as the
default (``DEFAULT``), so falling back is a lookup here, never one backend importing another.
Fallbacks are decided in this module: an operation with nothing to quantize (bits = 0), a
float64 operand or an empty tensor always runs the default implementation; a backend that has
no implementation of an operation gets the default's.

Conventions: block = 16; ``bits = 0`` means "no quantization" (q is float32, or float64 for a
float64 input, and scale is ones); ``scale_mode`` is ROW (one scale per output row) or TENSOR
(one scale); ``seed`` (an int, or a hot.common.quant.StepSeed that follows a layer's step
counter in device memory) feeds the counter-based stream of ``hot.common.quant.uniform`` over
the row-major index of q.

hq_quantize(x (R, C), HQArgs) -> Quantized(q (R, C16), scale (R|1, 1))
    C16 = C rounded up to a multiple of 16 (zero columns). With H = hadamard16() on each block
    of 16 consecutive columns:  q * scale ~= pad(x) @ (I (x) H).
    Used for g_y (R = tokens, C = O: scale per token or per tensor) and for W^T (R = I, C = O:
    scale per input channel), so both scales are constant along the contracted dimension O.

hla_quantize(x (L, C), HLAArgs) -> Quantized(q (C, Lr), scale (C|1, 1))
    L16 = L rounded up to a multiple of 16 (zero rows), Lr = L16 / 16 * rank. With T_r =
    hla_matrix(rank, selection) on each block of 16 consecutive rows:
    q * scale ~= ((I (x) T_r) pad(x))^T, i.e. q[c, j*rank + t] ~ sum_i T_r[t, i] x[16 j + i, c].
    Used for g_y (C = O) in backward and for x (C = I) in forward (ABC saves this q).
    A drawn selection (HLAConfig(selection="stratified"), HLAArgs.draw its seed) is
    hot.common.transforms.drawn_transform: each block's token signs from the draw, then the
    kept weighted rows; its scales are the absmax over all 16 weighted rows of the group (the
    same for every draw), so q * scale ~= the kept coefficients and no code clips. x's codes
    and g_y's take the same draw seed, so both keep the same rows of every block.
    With HLAArgs.history (HLAConfig.amax = "delayed"; ROW scales): scale =
    quant.delayed_scale(a, history, bits), a the columns' absmax of this transform, and then
    history = a, in place on the device (nothing waits for the host). A backend may form these
    codes from one read of x: codes with the candidate scales first, the columns outside the
    window again once a is known.

gy_quantize(x, HQArgs, HLAArgs) -> (Quantized, Quantized)
    The g_y pass, by definition exactly (hq_quantize(x, hq), hla_quantize(x, hla)): a backend
    may compute both from one read of x; the default runs the two operations.

plain_quantize(x (R, C), HQArgs) -> Quantized(q (R, C), scale (R|1, 1))
    q * scale ~= x: the quantizer of hq_quantize without the transform and without padding
    (the naive INT4 baseline, HOTConfig.int4()). The default implements it; no backend needs to.

luq_quantize(x (R, C), HQArgs) -> Quantized(q (R, C), scale (R|1, 1))
    LUQ's 4-bit radix-2 logarithmic quantizer (the LUQ baseline, HOTConfig.luq()): with the
    absmax a (per row or per tensor) and scale e = a / 2^(m-1), m = 7 magnitudes, the codes are
    0 and +-2^k, k = 0..m-1: |x| / e below 1 becomes 1 with probability |x| / e, else 0
    (stochastic underflow); between 2^k and 2^(k+1) it becomes 2^(k+1) with probability
    (|x| / e - 2^k) / 2^k, else 2^k (unbiased rounding between powers of two); E[q * e] = x.
    Round to nearest (stochastic=False) takes the nearer of the two. The default implements it.

int_gemm_nt(a (M, K), b (N, K), sa (M|1, 1), sb (N|1, 1), out_dtype, bias (N,) | None) -> (M, N)
    (a @ b^T) * sa * sb^T + bias, with the integer products accumulated exactly. For int8 codes,
        out[m, n] = cvt(((float32(sum_k a[m, k] b[n, k]) * sa[m]) * sb[n]) + bias[n])
    each float32 operation rounded to nearest in this order and cvt one rounding to nearest
    into out_dtype; bias=None drops the addition. The bias is a float32 vector of N values on
    a's device (else ValueError: check_bias): the quantized forward passes its layer's bias
    (under autocast already cast to the autocast dtype, as nn.Linear's is) widened to float32,
    so the epilogue adds it before the single rounding of the result and no pass of its own
    over the output is needed. Float operands (the default's): acc * sa * sb^T + bias in the float
    dtype of the GEMM. Degenerate products (M, N or K of 0 or 1: one token, a one-output head,
    HLA rank 1 on 16 tokens or fewer) always run the default implementation, with the bias,
    whatever the backend: integer GEMM kernels and libraries assume tiles and alignments such
    shapes do not have (``degenerate_gemm``).

layer_backward(gy, wt, x_codes, hq, hla, hq_w, gx_dtype, gw_dtype, need_gb) -> LayerGrads | None
    One layer's HOT backward in one call, by definition exactly
        (q1, s1), (q2, s2) = gy_quantize(gy, hq, hla);  qw, sw = hq_quantize(wt, hq_w)
        LayerGrads(int_gemm_nt(q1, qw, s1, sw, gx_dtype), int_gemm_nt(q2, qx, s2, sx, gw_dtype), gb)
    with (qx, sx) = x_codes and gb = gy.sum(0) (float32 accumulation, any order, in gy's dtype)
    when need_gb and the backend forms it on the way, else None (the caller sums). The result
    None means "not in one call for these arguments" (also whenever one of the two GEMMs is
    degenerate): the caller composes the operations. The default has none; the fast backend has it to save host time and a read of g_y.
    compose_layer_backward (not an operation: a function of them) is that composition, the one
    every caller runs: hot.nn.backward where layer_backward declines, and the fast backend's
    layer_backward on the first call for a pair of pass plans.
"""

from __future__ import annotations

import enum
from typing import Callable, NamedTuple, Optional

import torch

from .config import BLOCK
from .quant import StepSeed


class ScaleMode(str, enum.Enum):
    """Scale granularity of a quantized operand: one scale per output row, or one in all."""

    ROW = "row"
    TENSOR = "tensor"


class HQArgs(NamedTuple):
    """Arguments of hq_quantize after x."""

    bits: int  # 0 = no quantization
    scale_mode: ScaleMode
    stochastic: bool
    seed: "int | StepSeed"


class HLAArgs(NamedTuple):
    """Arguments of hla_quantize after x."""

    rank: int
    selection: str  # 'lowpass', 'lp_l1' or 'stratified' (hot.common.walsh.hla_rows)
    bits: int  # 0 = no quantization
    scale_mode: ScaleMode
    stochastic: bool
    seed: "int | StepSeed"
    # None: absmax scales. Else a float32 vector, one entry per scale group (column of x): the
    # absmax of each group in the previous pass, for quant.delayed_scale; the pass overwrites
    # it with its own.
    history: Optional[torch.Tensor] = None
    # A drawn selection's seed (an int or a StepSeed): which rows each block keeps. The x pass
    # of a layer's forward and the g_y pass of its backward take the same one.
    draw: "int | StepSeed | None" = None


class Quantized(NamedTuple):
    """Codes and scales: the operand is q * scale (scale broadcast along q's rows)."""

    q: torch.Tensor
    scale: torch.Tensor


class LayerGrads(NamedTuple):
    gx: Optional[torch.Tensor]
    gw: Optional[torch.Tensor]
    gb: Optional[torch.Tensor]


DEFAULT = "reference"
OPS = ("hq_quantize", "hla_quantize", "plain_quantize", "luq_quantize", "gy_quantize",
       "int_gemm_nt", "layer_backward")
_IMPLS: dict[str, dict[str, Callable]] = {name: {} for name in OPS}


def register(op: str, backend: str, fn: Callable) -> Callable:
    """Make ``fn`` the implementation of ``op`` on ``backend``."""
    if op not in _IMPLS:
        raise ValueError(f"unknown operation {op!r}; declared: {OPS}")
    _IMPLS[op][backend] = fn
    return fn


def implementation(op: str, backend: str) -> Optional[Callable]:
    """``backend``'s implementation of ``op``, else the default's (None if neither has one)."""
    impls = _IMPLS[op]
    fn = impls.get(backend)
    return fn if fn is not None else impls.get(DEFAULT)


def pad_to(n: int, m: int = BLOCK) -> int:
    return (n + m - 1) // m * m


def dtype_of_codes(bits: int, x: torch.Tensor) -> torch.dtype:
    if bits:
        return torch.int8
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _by_default(x: torch.Tensor, bits: int) -> bool:
    return bits == 0 or x.dtype == torch.float64 or x.numel() == 0


def _scale_rows(mode: ScaleMode, rows: int) -> int:
    return rows if mode == ScaleMode.ROW else 1


# ---------------------------------------------------------------- shapes (fake implementations)


def hq_fake(x: torch.Tensor, a: HQArgs) -> Quantized:
    r, c = x.shape
    return Quantized(x.new_empty((r, pad_to(c)), dtype=dtype_of_codes(a.bits, x)),
                     x.new_empty((_scale_rows(a.scale_mode, r), 1), dtype=torch.float32))


def plain_fake(x: torch.Tensor, a: HQArgs) -> Quantized:
    r, c = x.shape
    return Quantized(x.new_empty((r, c), dtype=dtype_of_codes(a.bits, x)),
                     x.new_empty((_scale_rows(a.scale_mode, r), 1), dtype=torch.float32))


def hla_fake(x: torch.Tensor, a: HLAArgs) -> Quantized:
    length, c = x.shape
    return Quantized(
        x.new_empty((c, pad_to(length) // BLOCK * a.rank), dtype=dtype_of_codes(a.bits, x)),
        x.new_empty((_scale_rows(a.scale_mode, c), 1), dtype=torch.float32))


def int_gemm_fake(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype,
                  bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


# ---------------------------------------------------------------- the operations


def _quantize(op: str, x: torch.Tensor, a, backend: str) -> Quantized:
    name = DEFAULT if _by_default(x, a.bits) else backend
    return Quantized(*implementation(op, name)(x, a))


def hq_quantize(x: torch.Tensor, a: HQArgs, backend: str) -> Quantized:
    return _quantize("hq_quantize", x, a, backend)


def hla_quantize(x: torch.Tensor, a: HLAArgs, backend: str) -> Quantized:
    return _quantize("hla_quantize", x, a, backend)


def plain_quantize(x: torch.Tensor, a: HQArgs, backend: str) -> Quantized:
    return _quantize("plain_quantize", x, a, backend)


def luq_quantize(x: torch.Tensor, a: HQArgs, backend: str) -> Quantized:
    return _quantize("luq_quantize", x, a, backend)


def gy_quantize(x: torch.Tensor, hq: HQArgs, hla: HLAArgs,
                backend: str) -> tuple[Quantized, Quantized]:
    fused = _IMPLS["gy_quantize"].get(backend)
    if fused is None or _by_default(x, hq.bits) or _by_default(x, hla.bits):
        # Through the dispatcher, not the public functions: one gy_quantize is one operation
        # whichever backend runs it (tests record the operations a backward calls).
        return _quantize("hq_quantize", x, hq, backend), _quantize("hla_quantize", x, hla, backend)
    a, b = fused(x, hq, hla)
    return Quantized(*a), Quantized(*b)


def degenerate_gemm(m: int, n: int, k: int) -> bool:
    """Whether an (M, N, K) product is one that int_gemm_nt always hands to the default
    implementation: an empty one, or one with a single row, column or contracted element."""
    return min(m, n, k) <= 1


def check_bias(bias: Optional[torch.Tensor], n: int, device: torch.device) -> None:
    """Raise ValueError unless ``bias`` is None or int_gemm_nt's bias for N = ``n`` output
    columns on ``device``: a 1-D float32 tensor of n elements there."""
    if bias is None:
        return
    if bias.dim() == 1 and bias.shape[0] == n and bias.dtype == torch.float32 \
            and bias.device == torch.device(device):
        return
    raise ValueError(
        f"int_gemm_nt: bias must be a 1-D float32 tensor of N = {n} elements (one per output "
        f"column) on {device}, got shape {tuple(bias.shape)}, dtype {bias.dtype} on "
        f"{bias.device}; pass a layer's bias as b.to(torch.float32).reshape({n}) on {device}")


def int_gemm_nt(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                out_dtype: torch.dtype, backend: str,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"int_gemm_nt: K differs: a {tuple(a.shape)} vs b {tuple(b.shape)}")
    check_bias(bias, b.shape[0], a.device)
    integer = a.dtype == torch.int8 and b.dtype == torch.int8
    name = backend if integer and not degenerate_gemm(a.shape[0], b.shape[0], a.shape[1]) \
        and out_dtype != torch.float64 else DEFAULT
    return implementation("int_gemm_nt", name)(a, b, sa, sb, out_dtype, bias=bias)


def layer_backward(gy: torch.Tensor, wt: torch.Tensor, x_codes: Quantized, hq: HQArgs,
                   hla: HLAArgs, hq_w: HQArgs, gx_dtype: torch.dtype, gw_dtype: torch.dtype,
                   need_gb: bool, backend: str) -> Optional[LayerGrads]:
    fn = _IMPLS["layer_backward"].get(backend)
    if fn is None or _by_default(gy, hq.bits) or _by_default(gy, hla.bits) \
            or _by_default(wt, hq_w.bits) or x_codes.q.dtype != torch.int8:
        return None
    # Its two GEMMs: g_x (L, I) over O rounded up to 16, g_W (O, I) over x's code columns. A
    # degenerate one goes through int_gemm_nt, which hands it to the default.
    (rows, o), i = gy.shape, wt.shape[0]
    if degenerate_gemm(rows, i, pad_to(o)) or degenerate_gemm(o, i, x_codes.q.shape[1]):
        return None
    out = fn(gy, wt, x_codes, hq, hla, hq_w, gx_dtype, gw_dtype, need_gb)
    return None if out is None else LayerGrads(*out)


def compose_layer_backward(gy: torch.Tensor, wt: torch.Tensor, x_codes: Quantized, hq: HQArgs,
                           hla: HLAArgs, hq_w: HQArgs, gx_dtype: torch.dtype,
                           gw_dtype: torch.dtype, need_gb: bool, backend: str,
                           gy_codes: Optional[tuple[Quantized, Quantized]] = None,
                           gb: Optional[torch.Tensor] = None) -> LayerGrads:
    """layer_backward by its definition: the composed operations, g_b = gy.sum(0) when need_gb.

    ``gy_codes``: gy_quantize(gy, hq, hla) where a backend formed it already, on its own pass
    (the fast layer_backward: the pass plan its one-call path needs, which also forms the bias
    sums); ``gb``: g_y's column sums where that pass formed them (float32), cast to gy's
    dtype after the GEMMs."""
    qx, sx = x_codes
    (q1, s1), (q2, s2) = gy_codes if gy_codes is not None else gy_quantize(gy, hq, hla, backend)
    qw, sw = hq_quantize(wt, hq_w, backend)
    gx = int_gemm_nt(q1, qw, s1, sw, gx_dtype, backend)
    gw = int_gemm_nt(q2, qx, s2, sx, gw_dtype, backend)
    if need_gb:
        gb = gy.sum(0) if gb is None else gb.to(gy.dtype)
    return LayerGrads(gx, gw, gb if need_gb else None)
