"""The autograd functions: exact forward, HOT backward, composed only of backend operations.

For a layer y = x W^T + b with tokens flattened to rows (x: L x I, g_y: L x O):

    forward   y = F.linear(x, W, b) (or F.conv2d), unchanged
              ABC: save (q_x, s_x) = hla_quantize(x), never x itself
    backward  g_x = int_gemm_nt(hq_quantize(g_y), hq_quantize(W^T))           (HQ)
              g_W = int_gemm_nt(hla_quantize(g_y), q_x) with scales s_gy, s_x   (HLA)
              g_b = sum over tokens of g_y                                      (exact)

A frozen weight skips ABC and the g_W path; an input that needs no gradient skips the g_x path
and does not keep W. During the layer's first ``exact_steps`` backward calls everything is exact
(and x is saved). With ``HLAConfig.abc == "recompute"`` a layer keeps x and forms (q_x, s_x) in
backward, with the forward's seed: the same codes (``abc_recomputes``); "auto" does so where x's
producer keeps x anyway.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..common import ops
from ..common.ops import direct as op
from ..common.ops import dtype_name
from .state import LayerPlan, begin_backward


def _seq_pad(t: torch.Tensor, seq: int) -> torch.Tensor:
    """Pad each sequence of ``seq`` consecutive rows to a multiple of 16 rows (blocking='sequence')."""
    if seq <= 0:
        return t
    n = t.shape[0] // seq
    s16 = ops.pad_to(seq)
    if s16 == seq:
        return t
    return F.pad(t.reshape(n, seq, -1), (0, 0, 0, s16 - seq)).reshape(n * s16, -1)


def no_autocast(device_type: str):
    """A context in which autocast is off. HOT's inputs arrive already cast (the layer applies
    autocast itself, as nn.Linear would), so the HOT work must not be autocast again; outside
    autocast this is a null context (entering torch.autocast costs host time on every call)."""
    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def _mode(scale: str) -> str:
    """Config scale granularity -> op scale_mode: per channel is one scale per op output row."""
    return "row" if scale == "channel" else "tensor"


def _hla_args(h) -> tuple:
    """The HLA arguments after x: (rank, selection, bits, scale_mode, stochastic)."""
    return (h.rank, h.selection, h.bits or 0, _mode(h.scale), h.rounding == "stochastic")


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


def abc_recomputes(plan: LayerPlan, x: torch.Tensor) -> bool:
    """Whether the ABC codes are formed in backward from a kept x (HLAConfig.abc): "recompute",
    or "auto" where x's producer keeps x anyway (forming the codes then moves work from forward
    to backward and keeps nothing more: the codes' bytes are saved)."""
    if plan.exact:
        return False
    abc = plan.config.hla.abc
    return abc == "recompute" or (abc == "auto" and kept_by_producer(x))


def abc_save(plan: LayerPlan, x2d: torch.Tensor):
    """What the forward keeps for the g_W path: (q_x, s_x), or x itself while exact."""
    if plan.exact:
        return (x2d,)
    h = plan.config.hla
    return op.hla_quantize(_seq_pad(x2d, plan.seq), *_hla_args(h), plan.seed_x, plan.backend)


def hot_backward(layer, plan: LayerPlan, gy2d: torch.Tensor, w2d, saved, need_gx: bool,
                 need_gw: bool, x_dtype: torch.dtype, w_dtype: torch.dtype, need_gb: bool = False):
    """(g_x as L x I, g_W as O x I, g_b); g_x / g_W are None when not needed. g_b = sum of g_y
    over tokens when need_gb and the backend's one-call backward formed it, else None (the
    caller sums g_y itself)."""
    bp = begin_backward(layer, plan, gy2d)
    gx = gw = None
    hq, h = plan.config.hq, plan.config.hla
    gy_hla = _seq_pad(gy2d, plan.seq) if need_gw and not bp.exact else gy2d
    fused = None
    if need_gx and need_gw and not bp.exact and bp.gx_bits and h.bits and gy_hla is gy2d:
        gy_args = (bp.gx_bits, bp.gy_scale_mode, hq.gy_rounding == "stochastic", bp.seed_gy)
        w_args = (bp.gx_bits, _mode(hq.w_scale), hq.w_rounding == "stochastic", bp.seed_w)
        one_call = ops.fused_backward(plan.backend)
        if one_call is not None:
            # By definition the composition below (hot.common.ops, fused_backward), or None.
            qx, sx = saved
            out = one_call(gy2d, w2d.t(), qx, sx, gy_args, (*_hla_args(h), bp.seed_hla), w_args,
                           x_dtype, w_dtype, need_gb)
            if out is not None:
                return out
        # Both paths quantize the same g_y: one fused pass (ops.gy_quantize is by definition the
        # pair of hq_quantize and hla_quantize below, with the same arguments).
        fused = op.gy_quantize(gy2d, *gy_args, *_hla_args(h), bp.seed_hla, plan.backend)
    if need_gx:
        if bp.exact:
            gx = (gy2d @ w2d.to(gy2d.dtype)).to(x_dtype)
        else:
            if fused is not None:
                qg, sg = fused[0], fused[1]
            else:
                qg, sg = op.hq_quantize(gy2d, bp.gx_bits, bp.gy_scale_mode,
                                        hq.gy_rounding == "stochastic", bp.seed_gy, plan.backend)
            qw, sw = op.hq_quantize(w2d.t(), bp.gx_bits, _mode(hq.w_scale),
                                    hq.w_rounding == "stochastic", bp.seed_w, plan.backend)
            gx = op.int_gemm_nt(qg, qw, sg, sw, dtype_name(x_dtype), plan.backend)
    if need_gw:
        if bp.exact:
            (x2d,) = saved
            gw = (gy2d.t().to(x2d.dtype) @ x2d).to(w_dtype)
        else:
            qx, sx = saved
            if fused is not None:
                qg, sg = fused[2], fused[3]
            else:
                qg, sg = op.hla_quantize(gy_hla, *_hla_args(h), bp.seed_hla, plan.backend)
            gw = op.int_gemm_nt(qg, qx, sg, sx, dtype_name(w_dtype), plan.backend)
    return gx, gw, None


class HOTLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer, plan: LayerPlan):
        y = F.linear(x, weight, bias)
        need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        x2d = x.reshape(-1, x.shape[-1])
        ctx.recompute = need_gw and abc_recomputes(plan, x)
        saved = () if not need_gw else (x2d,) if ctx.recompute else abc_save(plan, x2d)
        ctx.n_saved = len(saved)
        ctx.save_for_backward(*saved, *((weight,) if need_gx else ()))
        ctx.layer, ctx.plan = layer, plan
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, gy):
        need_gx, need_gw, need_gb = ctx.needs_input_grad[:3]
        t = ctx.saved_tensors
        saved, w = t[: ctx.n_saved], (t[ctx.n_saved] if need_gx else None)
        if ctx.recompute:  # implies need_gw
            with no_autocast(gy.device.type):
                saved = abc_save(ctx.plan, saved[0])
        gy2d = gy.reshape(-1, gy.shape[-1])
        need_gb = ctx.has_bias and need_gb
        gx, gw, gb = hot_backward(ctx.layer, ctx.plan, gy2d, w, saved, need_gx, need_gw,
                                  ctx.x_dtype, ctx.w_dtype, need_gb)
        if gx is not None:
            gx = gx.reshape(ctx.x_shape)
        if need_gb and gb is None:
            gb = gy2d.sum(0)
        return gx, gw, gb, None, None


def patches(x: torch.Tensor, ksize, stride, padding, dilation) -> torch.Tensor:
    """The patches of x (B, C, H, W) as rows: (B * Ho * Wo, C * kh * kw), row (b, oh, ow) and
    column (c, i, j), i.e. exactly ``F.unfold(x, ...).transpose(1, 2).reshape(-1, C * kh * kw)``.

    Where dilation is 1 the patches are strided views (Tensor.unfold) copied once: F.unfold on
    CUDA launches one im2col kernel per image, which cost ~4 ms per ViT-B/16 step at batch 128
    for the patch embedding alone (H100, docs/performance.md, round 5)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = ksize, stride, padding, dilation
    if (dh, dw) != (1, 1):
        xu = F.unfold(x, (kh, kw), dilation, padding, stride)  # (B, Ckk, L)
        return xu.transpose(1, 2).reshape(-1, xu.shape[1])
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    v = x.unfold(2, kh, sh).unfold(3, kw, sw)  # (B, C, Ho, Wo, kh, kw): a view
    b, c, ho, wo = v.shape[:4]
    return v.permute(0, 2, 3, 1, 4, 5).reshape(b * ho * wo, c * kh * kw)


class HOTConv2dFunction(torch.autograd.Function):
    """Conv2d (groups = 1) as a linear over unfolded patches: rows = (image, output position),
    columns = C * kh * kw. Forward uses F.conv2d; only the ABC copy is built from the patches."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer, plan: LayerPlan, geom):
        stride, padding, dilation = geom
        y = F.conv2d(x, weight, bias, stride, padding, dilation)
        need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        saved = ()
        ctx.recompute = need_gw and abc_recomputes(plan, x)
        if ctx.recompute:
            saved = (x,)
        elif need_gw:
            # The patches are a transient of up to kh*kw times x's size (freed after ABC).
            saved = abc_save(plan, patches(x, weight.shape[-2:], stride, padding, dilation))
        ctx.n_saved = len(saved)
        ctx.save_for_backward(*saved, *((weight,) if need_gx else ()))
        ctx.layer, ctx.plan, ctx.geom = layer, plan, geom
        ctx.x_shape, ctx.x_dtype, ctx.w_dtype = x.shape, x.dtype, weight.dtype
        ctx.w_shape, ctx.has_bias = weight.shape, bias is not None
        return y

    @staticmethod
    def backward(ctx, gy):
        need_gx, need_gw, need_gb = ctx.needs_input_grad[:3]
        stride, padding, dilation = ctx.geom
        t = ctx.saved_tensors
        saved = t[: ctx.n_saved]
        if ctx.recompute:  # implies need_gw
            with no_autocast(gy.device.type):
                saved = abc_save(ctx.plan, patches(saved[0], ctx.w_shape[-2:], *ctx.geom))
        w = t[ctx.n_saved].reshape(ctx.w_shape[0], -1) if need_gx else None
        o = gy.shape[1]
        gy2d = gy.permute(0, 2, 3, 1).reshape(-1, o)
        need_gb = ctx.has_bias and need_gb
        gx, gw, gb = hot_backward(ctx.layer, ctx.plan, gy2d, w, saved, need_gx, need_gw,
                                  ctx.x_dtype, ctx.w_dtype, need_gb)
        if gx is not None:
            b = ctx.x_shape[0]
            gx = gx.reshape(b, -1, gx.shape[1]).transpose(1, 2)
            # fold is the adjoint of unfold: overlapping patches sum, as the exact gradient does.
            gx = F.fold(gx, ctx.x_shape[-2:], ctx.w_shape[-2:], dilation, padding, stride)
        if gw is not None:
            gw = gw.reshape(ctx.w_shape)
        if need_gb and gb is None:
            gb = gy2d.sum(0)
        return gx, gw, gb, None, None, None
