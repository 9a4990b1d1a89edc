"""A HOT layer's backward, composed only of backend operations (hot.common.ops).

For a layer y = x W^T + b with tokens flattened to rows (x: L x I, g_y: L x O):

    forward   y = F.linear(x, W, b) (or F.conv2d), unchanged
              ABC: keep (q_x, s_x) = hla_quantize(x), never x itself
    backward  g_x = int_gemm_nt(hq_quantize(g_y), hq_quantize(W^T))           (HQ)
              g_W = int_gemm_nt(hla_quantize(g_y), q_x) with scales s_gy, s_x   (HLA)
              g_b = sum over tokens of g_y                                      (exact)
              (ops.layer_backward in one call, else ops.compose_layer_backward; a g_y
              whose codes reach SPLIT_GY_CODES bytes: the g_x path, then the g_W path, each
              over chunks of g_y: split_backward)

A frozen weight skips ABC and the g_W path; an input that needs no gradient skips the g_x path
and does not keep W. During the layer's first ``exact_steps`` backward calls, and from call
``exact_from`` on, everything is exact (and x is kept). With ``HLAConfig.abc == "recompute"`` a
layer keeps x and forms (q_x, s_x) in backward with the forward's seed: the same codes; "auto"
does so where keeping x is free.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ..common import ops
from ..common.ops import HLAArgs, HQArgs, LayerGrads, Quantized, ScaleMode
from ..common.quant import StepSeed, derive_seed
from ..common.transforms import hla_untransform
from .state import LayerPlan, begin_backward


def pads_sequences(seq: int) -> bool:
    """Whether seq_pad changes its input: sequences of ``seq`` rows not a multiple of 16."""
    return seq > 0 and ops.pad_to(seq) != seq


def seq_pad(t: torch.Tensor, seq: int) -> torch.Tensor:
    """Pad each sequence of ``seq`` consecutive rows to a multiple of 16 rows (blocking='sequence')."""
    if not pads_sequences(seq):
        return t
    n, s16 = t.shape[0] // seq, ops.pad_to(seq)
    return F.pad(t.reshape(n, seq, -1), (0, 0, 0, s16 - seq)).reshape(n * s16, -1)


# g_y's HQ codes (one byte per element) from which a layer's backward forms its two paths one
# after the other, each over chunks of g_y (split_backward): at least 512 MiB. The one pass
# (gy_quantize) holds both paths' codes at once, 1.5 bytes per element of g_y at HLA rank 8;
# for a language model's output layer (tokens x vocabulary) that is the step's peak (1.9 GiB on
# a 1B Llama at 32k tokens and a 32k vocabulary, all of it live beside every saved activation,
# since that layer's backward runs first). The split reads g_y twice: about 0.35 ms per GiB of
# bf16 g_y on an H100, paid by every layer at least this large: at 32k tokens a step, of
# Llama-1b's and Llama-8B's layers only the output layer.
SPLIT_GY_CODES = 1 << 29
# The codes of one chunk of a split backward, at most, by path: g_x's HQ codes of a chunk of
# tokens, g_W's HLA codes of a chunk of output channels. The g_W path runs at the layer's peak
# (g_x and g_W both live beside g_y), so its chunks are the smaller: what a chunk holds beyond
# them is its codes and its slice of g_W. Neither is smaller than one wave of GEMM tiles needs:
# on Llama-1b's output layer (32k tokens, 2048 -> 32000) a g_x chunk is 2048 tokens and a g_W
# chunk 2048 channels, each GEMM 2048 x 2048 (128 tiles of 128 x 256 for an H100's 132 SMs).
CHUNK_CODES_GX = 1 << 26
CHUNK_CODES_GW = 1 << 25


def splits_gy_pass(gy2d: torch.Tensor) -> bool:
    """Whether a layer's backward quantizes g_y for its two paths apart and in chunks
    (split_backward) rather than in one pass: g_y's codes at least SPLIT_GY_CODES bytes."""
    return gy2d.numel() >= SPLIT_GY_CODES


def gw_dtype(gy2d: torch.Tensor, w_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the g_W a layer's backward returns: W's, except where the backward is split
    (splits_gy_pass) and g_y's dtype is narrower (a bfloat16 g_y, a float32 W under autocast):
    then g_y's, as an autocast nn.Linear's g_W is. Autograd makes the float32 copy after the
    layer's backward, once g_y is freed, rather than the backward holding a float32 g_W beside
    g_y at the step's peak (an LM's output layer: 32000 x 2048, 250 MiB instead of 125). The
    values are the float32 ones rounded to nearest in g_y's dtype."""
    if splits_gy_pass(gy2d) and gy2d.dtype.itemsize < w_dtype.itemsize:
        return gy2d.dtype
    return w_dtype


def chunks(n: int, width: int, budget: int) -> list[tuple[int, int]]:
    """[start, stop) ranges covering 0..n with budget // width entries each (a multiple of 64,
    the quantizer tiles' side, and at least 64): the rows or columns of one chunk whose codes
    take ``width`` bytes per row or column and at most ``budget`` bytes in all."""
    step = max(64, budget // max(width, 1) // 64 * 64)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def chunk_seed(seed: "int | StepSeed", c: int) -> "int | StepSeed":
    """The stochastic-rounding seed of chunk ``c`` of a split backward: ``seed`` itself for
    chunk 0, else derive_seed(seed, c) (of a StepSeed's base), so no two chunks round with the
    same numbers."""
    if c == 0:
        return seed
    if isinstance(seed, StepSeed):
        return seed._replace(base=derive_seed(seed.base, c))
    return derive_seed(seed, c)


def split_backward(gy2d: torch.Tensor, gy_hla: torch.Tensor, w2d: Optional[torch.Tensor],
                   saved: Optional[Quantized], hq: HQArgs, hq_w: HQArgs, hla: HLAArgs,
                   need_gx: bool, need_gw: bool, x_dtype: torch.dtype, w_dtype: torch.dtype,
                   backend: str, chunked: bool = True
                   ) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """(g_x, g_W) from the two paths apart: the g_x path, then the g_W path. ``chunked`` (a g_y
    too large for one pass, splits_gy_pass): each path over chunks (``chunks``) whose codes are
    freed before the next:

        g_x[a:b] = int_gemm_nt(hq_quantize(g_y[a:b], hq_c), hq_quantize(W^T, hq_w))
                   over chunks [a, b) of the tokens (rows of g_y)
        g_W[a:b] = int_gemm_nt(hla_quantize(g_y[:, a:b], hla_c), q_x)
                   over chunks [a, b) of the output channels (columns of g_y)

    where hq_c, hla_c are hq, hla with chunk_seed(seed, c); else each path in one piece (chunk 0
    alone). A chunk is quantized as a tensor of its own: per-token HQ scales and per-channel HLA
    scales are those of the whole g_y (each covers one row, resp. column, and a chunk holds
    whole ones); a per-tensor scale is the chunk's absmax; the drawn HLA rows follow hla.draw,
    per block of 16 tokens, in every chunk alike. Each chunk's codes are unbiased as the one
    pass's are; they differ from them by the chunks' own random numbers (and per-tensor
    scales)."""
    gx = gw = None
    if need_gx:
        qw = ops.hq_quantize(w2d.t(), hq_w, backend)

        def gx_part(c: int, a: int, b: int) -> torch.Tensor:
            qg = ops.hq_quantize(gy2d[a:b], hq._replace(seed=chunk_seed(hq.seed, c)), backend)
            return ops.int_gemm_nt(qg.q, qw.q, qg.scale, qw.scale, x_dtype, backend)

        n = gy2d.shape[0]
        spans = chunks(n, gy2d.shape[1], CHUNK_CODES_GX) if chunked else [(0, n)]
        gx = _assemble(spans, (n, w2d.shape[1]), x_dtype, gy2d, gx_part)
        del qw  # freed before the g_W path's codes
    if need_gw:

        def gw_part(c: int, a: int, b: int) -> torch.Tensor:
            args = hla._replace(seed=chunk_seed(hla.seed, c),
                                history=None if hla.history is None else hla.history[a:b])
            qh = ops.hla_quantize(gy_hla[:, a:b], args, backend)
            return ops.int_gemm_nt(qh.q, saved.q, qh.scale, saved.scale, w_dtype, backend)

        n = gy_hla.shape[1]
        lr = saved.q.shape[1]  # HLA coefficients per column: tokens / 16 * rank
        spans = chunks(n, lr, CHUNK_CODES_GW) if chunked else [(0, n)]
        gw = _assemble(spans, (n, saved.q.shape[0]), w_dtype, gy2d, gw_part)
    return gx, gw


def _assemble(spans: list[tuple[int, int]], shape: tuple[int, int], dtype: torch.dtype,
              like: torch.Tensor, part: Callable[[int, int, int], torch.Tensor]) -> torch.Tensor:
    """The rows [a, b) of each span from part(c, a, b) (chunk c) in one tensor of ``shape``; a
    single span's part is the result itself. Each part's codes are freed when it returns, before
    the next chunk's are formed."""
    if len(spans) == 1:
        return part(0, *spans[0])
    out = like.new_empty(shape, dtype=dtype)
    for c, (a, b) in enumerate(spans):
        out[a:b] = part(c, a, b)
    return out


def no_autocast(device_type: str):
    """A context in which autocast is off. HOT's inputs arrive already cast (the layer applies
    autocast itself, as nn.Linear would), so the HOT work must not be autocast again; outside
    autocast this is a null context (entering torch.autocast costs host time on every call)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def scale_mode(granularity: str) -> ScaleMode:
    """Config scale granularity -> op scale mode: per channel is one scale per op output row."""
    return ScaleMode.ROW if granularity in ("channel", "token") else ScaleMode.TENSOR


def hla_args(plan: LayerPlan, seed: int, history: Optional[torch.Tensor] = None,
             draw: "int | StepSeed" = 0) -> HLAArgs:
    """HLA's quantizer arguments; ``history``: the operand's delayed absmax (hla_history);
    ``draw``: a drawn selection's seed (LayerPlan.seed_draw)."""
    h = plan.config.hla
    return HLAArgs(h.rank, h.selection, h.bits or 0, scale_mode(h.scale),
                   h.rounding == "stochastic", seed, history, draw if draw else None)


# Autograd nodes that keep their own output (first output) for backward: ReLU, sigmoid, tanh,
# softmax, exp, attention... Keyed by node type; filled on first sight.
_KEEPS_RESULT: dict = {}


def kept_by_producer(x: torch.Tensor) -> bool:
    """Whether the autograd node that made ``x`` keeps ``x`` itself for its own backward (its
    first output saved as ``result`` / ``output``), so keeping x costs no memory. Read from the
    node's type: nothing is unpacked (saved-tensor hooks, e.g. offloading, are never run)."""
    node = x.grad_fn
    if node is None or x.output_nr != 0:
        return False
    keeps = _KEEPS_RESULT.get(type(node))
    if keeps is None:
        keeps = _KEEPS_RESULT[type(node)] = any(
            hasattr(node, a) for a in ("_saved_result", "_saved_output", "_saved_result0"))
    return keeps


def abc_codes(plan: LayerPlan, x2d: torch.Tensor) -> Quantized:
    """ABC: the codes the g_W path needs of x (rows = tokens), with the forward's seed."""
    return ops.hla_quantize(seq_pad(x2d, plan.seq),
                            hla_args(plan, plan.seed_x, plan.x_hist, plan.seed_draw),
                            plan.backend)


def hot_backward(layer, plan: LayerPlan, gy2d: torch.Tensor, w2d: Optional[torch.Tensor],
                 saved: Optional[torch.Tensor | Quantized], need_gx: bool, need_gw: bool,
                 x_dtype: torch.dtype, w_dtype: torch.dtype, need_gb: bool) -> LayerGrads:
    """(g_x as L x I, g_W as O x I, g_b), each None when not needed; ``saved`` is x (2-D) while
    exact, else the ABC codes. g_b is always formed when need_gb."""
    bp = begin_backward(layer, plan, gy2d)
    grads = _grads(plan, bp, gy2d, w2d, saved, need_gx, need_gw, x_dtype, w_dtype, need_gb)
    layer.hot_advance_step()  # after the kernels that read the step are enqueued
    return grads


def _gx_args(cfg, bp) -> tuple[HQArgs, HQArgs]:
    """The quantizer arguments of g_x's two operands, g_y and W^T: hq's bits of this call, the
    g_y scale mode of this call (LQS's), hq's W scale and each operand's rounding and seed."""
    return (HQArgs(bp.gx_bits, bp.gy_scale_mode, cfg.hq.gy_rounding == "stochastic", bp.seed_gy),
            HQArgs(bp.gx_bits, scale_mode(cfg.hq.w_scale), cfg.hq.w_rounding == "stochastic",
                   bp.seed_w))


def _grads(plan: LayerPlan, bp, gy2d, w2d, saved, need_gx, need_gw, x_dtype, w_dtype,
           need_gb) -> LayerGrads:
    if bp.exact:
        gx = (gy2d @ w2d.to(gy2d.dtype)).to(x_dtype) if need_gx else None
        gw = (gy2d.t().to(saved.dtype) @ saved).to(w_dtype) if need_gw else None
        return LayerGrads(gx, gw, gy2d.sum(0) if need_gb else None)
    cfg = plan.config
    if cfg.method == "lbp_wht":
        return _lbp_wht_grads(plan, bp, gy2d, w2d, saved, need_gx, need_gw, x_dtype, w_dtype,
                              need_gb)
    if cfg.method != "hot":
        return _baseline_grads(plan, bp, gy2d, w2d, saved, need_gx, need_gw, x_dtype, w_dtype,
                               need_gb)
    hq, hq_w = _gx_args(cfg, bp)
    hla = hla_args(plan, bp.seed_hla, bp.gy_hist, bp.seed_draw)
    gy_hla = seq_pad(gy2d, plan.seq) if need_gw else gy2d
    gx = gw = gb = None
    if need_gx and need_gw and gy_hla is gy2d and not splits_gy_pass(gy2d):
        # Both paths quantize the same g_y: one pass (layer_backward, or the composition's
        # gy_quantize). A backend's one call may leave g_b to the sum below.
        args = (gy2d, w2d.t(), saved, hq, hla, hq_w, x_dtype, w_dtype, need_gb, plan.backend)
        out = ops.layer_backward(*args)
        gx, gw, gb = out if out is not None else ops.compose_layer_backward(*args)
    else:
        gx, gw = split_backward(gy2d, gy_hla, w2d, saved, hq, hq_w, hla, need_gx, need_gw,
                                x_dtype, w_dtype, plan.backend, splits_gy_pass(gy2d))
    if need_gb and gb is None:
        gb = gy2d.sum(0)
    return LayerGrads(gx, gw, gb)


def _lbp_wht_grads(plan: LayerPlan, bp, gy2d, w2d, saved, need_gx, need_gw, x_dtype, w_dtype,
                   need_gb) -> LayerGrads:
    """LBP-WHT (HOTConfig.lbp_wht()): g_y projected along the tokens on both paths, nothing
    quantized. g_x = (I (x) T_r)^T ((T g_y) W), the GEMM in the low-pass domain (r/16 of the
    tokens); g_W = (T g_y)^T (T x) with T x the forward's codes (HLA with bits None)."""
    hla = hla_args(plan, 0)
    coef = ops.hla_quantize(gy2d, hla, ops.DEFAULT).q  # (O, Lr): T g_y, transposed
    gx = gw = None
    if need_gx:
        low = coef.t() @ w2d.to(coef.dtype)  # (Lr, I)
        gx = hla_untransform(low, hla.rank, hla.selection, gy2d.shape[0]).to(x_dtype)
    if need_gw:
        gw = (coef @ saved.q.to(coef.dtype).t()).to(w_dtype)
    return LayerGrads(gx, gw, gy2d.sum(0) if need_gb else None)


def _baseline_grads(plan: LayerPlan, bp, gy2d, w2d, x2d, need_gx, need_gw, x_dtype, w_dtype,
                    need_gb) -> LayerGrads:
    """The baselines without a transform (HOTConfig.int4(), HOTConfig.luq()): the same two GEMMs
    on operands quantized directly. g_x = Q(g_y) Q(W^T)^T contracts over O, so g_y's scale is
    per token or per tensor and W^T's per input channel or per tensor; g_W = Q(g_y^T) Q(x^T)^T
    contracts over the tokens, so the scales are per output / input channel or per tensor. g_y's
    quantizer is LUQ's for "luq", the plain one for "int4"; W and x always get the plain one.
    Reference operations on every backend: no fast kernel takes untransformed codes."""
    cfg, ref = plan.config, ops.DEFAULT
    gy_quantize = ops.luq_quantize if cfg.method == "luq" else ops.plain_quantize
    gx = gw = None
    if need_gx:
        hq, hq_w = _gx_args(cfg, bp)
        qg, qw = gy_quantize(gy2d, hq, ref), ops.plain_quantize(w2d.t(), hq_w, ref)
        gx = ops.int_gemm_nt(qg.q, qw.q, qg.scale, qw.scale, x_dtype, ref)
    if need_gw:
        h = cfg.hla
        mode, sr = scale_mode(h.scale), h.rounding == "stochastic"
        qg = gy_quantize(gy2d.t(), HQArgs(h.bits or 0, mode, sr, bp.seed_hla), ref)
        qx = ops.plain_quantize(x2d.t(), HQArgs(h.bits or 0, mode, sr, plan.seed_x), ref)
        gw = ops.int_gemm_nt(qg.q, qx.q, qg.scale, qx.scale, w_dtype, ref)
    return LayerGrads(gx, gw, gy2d.sum(0) if need_gb else None)


def patches(x: torch.Tensor, ksize, stride, padding, dilation) -> torch.Tensor:
    """The patches of x (B, C, H, W) as rows: (B * Ho * Wo, C * kh * kw), row (b, oh, ow) and
    column (c, i, j), i.e. exactly ``F.unfold(x, ...).transpose(1, 2).reshape(-1, C * kh * kw)``.

    Where dilation is 1 the patches are strided views (Tensor.unfold) copied once: F.unfold on
    CUDA launches one im2col kernel per image (about 4 ms per ViT-B/16 step at batch 128 for the
    patch embedding alone on an H100)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = ksize, stride, padding, dilation
    if (dh, dw) != (1, 1):
        xu = F.unfold(x, (kh, kw), dilation, padding, stride)  # (B, Ckk, L)
        return xu.transpose(1, 2).reshape(-1, xu.shape[1])
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    v = x.unfold(2, kh, sh).unfold(3, kw, sw)  # (B, C, Ho, Wo, kh, kw): a view
    b, c, ho, wo = v.shape[:4]
    return v.permute(0, 2, 3, 1, 4, 5).reshape(b * ho * wo, c * kh * kw)
