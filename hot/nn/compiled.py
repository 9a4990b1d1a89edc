"""The torch.compile path of HOT layers: opaque custom ops, so a compiled model has no graph
break at a HOT layer.

A HOT layer's backward reads and advances per-layer state on every call (step counter, seeds,
LQS), which a traced graph would freeze into constants. So the HOT work is hidden inside three
torch.library custom ops whose Python implementations read that state at run time, exactly as
the eager path does (``make_plan``, ``abc_save``, ``hot_backward``: no duplicated math):

    hot::linear_fwd(x2d, W, b, key, need_gx, need_gw, exact, seq, rank, bits, row, recompute)
        -> (y2d = x2d W^T + b, q_x, s_x)     q_x, s_x = the ABC copy (empty when not kept);
                                             with recompute: (y2d, empty, the ABC seed as a
                                             CPU int64), x2d is kept instead
    hot::conv_fwd(x, W, b, key, stride, padding, dilation, <same flags>)
        -> (y = conv2d(x, W, b), q_x, s_x)   ABC of the unfolded patches (or the patches
                                             themselves while exact; with recompute, x is kept,
                                             and backward unfolds it in traced code)
    hot::layer_bwd(g_y2d, W2d, saved0, saved1, key, exact, seq, need_gx, need_gw, need_gb,
                  in_features, x_dtype, w_dtype, recompute)
        -> (g_x2d, g_W2d, g_b)   (empty when not needed; with recompute, saved0 = x2d and
                                  saved1 = the seed: the ABC copy is formed here)

A torch.autograd.Function per forward op (_LinearFn, _ConvFn) carries its backward, which
dynamo traces into the joint graph; reshapes and F.fold stay in the traced graph. The bias
gradient (sum of g_y over tokens) is computed inside layer_bwd, as eager mode does: the same summation order, and the op always has a used output
when it runs, so a layer whose only trainable tensor is the bias still advances its step (a
functional op whose outputs are all unused would be dead-code eliminated).

``key`` is a per-layer constant: an int that names the layer in a registry of weak references,
so dynamo bakes it into the graph and no step recompiles. Everything fixing the saved tensors'
shapes is an explicit constant argument read from the layer while tracing (dynamo guards on
each value): the config's HLA rank / bits / scale, the blocking length ``seq``, which gradients
are needed, and the phase ``exact`` (the first ``exact_steps`` backward calls save x instead of
the codes). The end of the exact phase therefore recompiles once: ``_hot_exact_phase`` is a bool
that flips once, unlike the step counter which would recompile every step. The run-time
implementations check these constants against the layer's live state and raise on a stale graph
instead of computing with the wrong plan.

Ops that are not ATen builtins are never recomputed in backward by AOT autograd's partitioner,
so each forward op runs once per call (its seed draw and ABC happen once, as in eager mode).
With HLAConfig.abc "recompute" (and "auto" traced while ``torch._functorch.config.
ban_recompute_materialized_backward`` is False) the forward op keeps x2d, a plain tensor the
partitioner may rebuild in backward from what other ops keep rather than save; the seed drawn
in forward travels as a CPU tensor, so the codes are those of eager mode's forward.
The ops are tagged cudagraph_unsafe: a CUDA graph would replay their kernels with the seeds of
the captured step and skip the host-side state updates (mode="reduce-overhead" then runs them
outside the CUDA graphs).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch
import torch.nn.functional as F

from ..common import ops
from ..common.ops import dtype_name
from .function import _seq_pad, abc_save, hot_backward, no_autocast, patches
from .state import LayerPlan, make_plan

# torch 2.14 has the tag; on a torch without it the ops go untagged.
_TAGS = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)

# Declared with torch.library.Library rather than torch.library.custom_op: custom_op's autograd
# wrapper (a no-grad redispatch), dynamo-disable wrapper and output-alias check cost about 60 us
# of host time per call on this project's CPU, run even inside a compiled graph, twice per layer
# and step (benchmarks/host_mock.py). Here the dispatcher calls the Python body directly and the
# autograd wiring is a torch.autograd.Function, which dynamo traces into the joint graph.
_LIB = torch.library.Library("hot", "FRAGMENT")


def _def(schema: str, fn, fake):
    """Declare hot::<schema> with ``fn`` as its kernel on every device and ``fake`` for tracing."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema, tags=_TAGS)
    # Per device, not CompositeExplicitAutograd (which would also serve meta tensors: the body
    # reads live layer state and must never run while tracing).
    for key in ("CPU", "CUDA", "XPU", "MPS"):
        _LIB.impl(name, fn, key)
    torch.library.register_fake("hot::" + name, fake, lib=_LIB)
    return getattr(torch.ops.hot, name).default


_LAYERS: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)


def register(layer) -> int:
    """A fresh key naming ``layer`` (weakly) for the compiled ops."""
    key = next(_KEYS)
    _LAYERS[key] = layer
    return key


def _layer(key: int):
    layer = _LAYERS.get(key)
    if layer is None:
        raise RuntimeError(
            f"HOT compile path: layer key {key} names a HOT layer that no longer exists: a "
            f"compiled graph outlived its model. Call torch._dynamo.reset() and compile again.")
    return layer


def _empty(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(0)


def _live_plan(layer, x: torch.Tensor, seq: int, exact: bool, rank: int, bits: int,
               row: bool, recompute: bool) -> LayerPlan:
    """make_plan as in eager mode (draws the ABC seed), after checking the traced constants."""
    cfg = layer.hot_config
    plan = make_plan(layer, cfg, layer._backend_for(x.device), seq)
    h = cfg.hla
    # "auto" was resolved when the graph was traced (from the partitioner's flag): either is live.
    live = (plan.exact, h.rank, h.bits or 0, h.scale == "channel",
            recompute if h.abc == "auto" else h.abc == "recompute")
    if live != (exact, rank, bits, row, recompute):
        raise RuntimeError(
            f"HOT layer {layer.hot_name!r}: the compiled graph was traced for (exact, rank, bits, "
            f"per-channel scale, ABC recompute) = {(exact, rank, bits, row, recompute)} but the "
            f"layer now has {live}; this is a missing recompile: call torch._dynamo.reset() "
            f"and compile again.")
    return plan


def _seed_tensor(seed: int) -> torch.Tensor:
    # On the CPU: backward reads it back without a device synchronization.
    return torch.tensor([seed], dtype=torch.int64)


def _abc_fake(x2d: torch.Tensor, seq: int, rank: int, bits: int, row: bool):
    """Shapes of abc_save's (q, s), from the declared hla_quantize op on fake tensors."""
    return ops.hla_quantize(_seq_pad(x2d, seq), rank, "lowpass", bits,
                            "row" if row else "tensor", False, 0, "reference")


# ---------------------------------------------------------------- linear


def _linear_fwd(x2d: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], key: int,
                need_gx: bool, need_gw: bool, exact: bool, seq: int, rank: int, bits: int,
                row: bool, recompute: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layer = _layer(key)
    with no_autocast(x2d.device.type):
        y = F.linear(x2d, w, b)
        plan = _live_plan(layer, x2d, seq, exact, rank, bits, row, recompute)
        if need_gw and not exact:
            if recompute:  # setup_context keeps x2d
                return y, _empty(y), _seed_tensor(plan.seed_x)
            q, s = abc_save(plan, x2d)
            return y, q.contiguous(), s.contiguous()
    # While exact, x2d itself is kept (setup_context saves the input: no copy).
    return y, _empty(y), _empty(y)


def _linear_fwd_fake(x2d, w, b, key, need_gx, need_gw, exact, seq, rank, bits, row, recompute):
    y = F.linear(x2d, w, b)
    if need_gw and not exact:
        if recompute:
            return y, _empty(y), torch.empty(1, dtype=torch.int64)
        q, s = _abc_fake(x2d, seq, rank, bits, row)
        return y, q, s
    return y, _empty(y), _empty(y)


def _linear_setup(ctx, inputs, output):
    x2d, w, b, key, need_gx, need_gw, exact, seq, rank, bits, row, recompute = inputs
    _, q, s = output
    recompute = recompute and not exact
    saved = ((x2d,) if exact else (x2d, s) if recompute else (q, s)) if need_gw else ()
    _setup_common(ctx, saved, w if need_gx else None, key, exact, seq, need_gx, need_gw,
                  x2d.shape[1], x2d.dtype, w.dtype, recompute)
    ctx.has_bias = b is not None


def _linear_backward(ctx, gy2d, _gq, _gs):
    gx, gw, gb = _backward_2d(ctx, gy2d)
    return gx, gw, gb, None, None, None, None, None, None, None, None, None


linear_fwd = _def("linear_fwd(Tensor x2d, Tensor w, Tensor? b, int key, bool need_gx, "
                  "bool need_gw, bool exact, int seq, int rank, int bits, bool row, "
                  "bool recompute) -> (Tensor, Tensor, Tensor)", _linear_fwd, _linear_fwd_fake)


class _LinearFn(torch.autograd.Function):
    """hot::linear_fwd with its backward (hot::layer_bwd)."""

    forward = staticmethod(linear_fwd)
    setup_context = staticmethod(_linear_setup)
    backward = staticmethod(_linear_backward)


# ---------------------------------------------------------------- conv2d


def _conv_fwd(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], key: int,
             stride: list[int], padding: list[int], dilation: list[int], need_gx: bool,
             need_gw: bool, exact: bool, seq: int, rank: int, bits: int,
             row: bool, recompute: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layer = _layer(key)
    with no_autocast(x.device.type):
        y = F.conv2d(x, w, b, stride, padding, dilation)
        plan = _live_plan(layer, x, seq, exact, rank, bits, row, recompute)
        if not need_gw:
            return y, _empty(y), _empty(y)
        if recompute and not exact:  # setup_context keeps x
            return y, _empty(y), _seed_tensor(plan.seed_x)
        saved = abc_save(plan, patches(x, w.shape[-2:], stride, padding, dilation))
    if exact:  # the patches themselves (a transient of kh*kw times x, as in eager mode)
        return y, saved[0].contiguous(), _empty(y)
    return y, saved[0].contiguous(), saved[1].contiguous()


def _conv_fwd_fake(x, w, b, key, stride, padding, dilation, need_gx, need_gw, exact, seq, rank,
                   bits, row, recompute):
    y = F.conv2d(x, w, b, stride, padding, dilation)
    if not need_gw:
        return y, _empty(y), _empty(y)
    if recompute and not exact:
        return y, _empty(y), torch.empty(1, dtype=torch.int64)
    rows = x.new_empty((y.shape[0] * y.shape[2] * y.shape[3], w[0].numel()))
    if exact:
        return y, rows, _empty(y)
    q, s = _abc_fake(rows, seq, rank, bits, row)
    return y, q, s


def _conv_setup(ctx, inputs, output):
    (x, w, b, key, stride, padding, dilation, need_gx, need_gw, exact, seq, rank, bits, row,
     recompute) = inputs
    _, q, s = output
    recompute = recompute and not exact
    saved = ((q,) if exact else (x, s) if recompute else (q, s)) if need_gw else ()
    _setup_common(ctx, saved, w.reshape(w.shape[0], -1) if need_gx else None, key, exact, seq,
                  need_gx, need_gw, w[0].numel(), x.dtype, w.dtype, recompute)
    ctx.has_bias = b is not None
    ctx.geom = (tuple(stride), tuple(padding), tuple(dilation))
    ctx.x_shape, ctx.w_shape = tuple(x.shape), tuple(w.shape)


def _conv_backward(ctx, gy, _gq, _gs):
    stride, padding, dilation = ctx.geom
    gy2d = gy.permute(0, 2, 3, 1).reshape(-1, gy.shape[1])
    unfold = None
    if ctx.recompute:  # traced: the patches of the kept x, for layer_bwd's ABC
        unfold = lambda x: patches(x, ctx.w_shape[-2:], stride, padding, dilation)  # noqa: E731
    gx, gw, gb = _backward_2d(ctx, gy2d, unfold)
    if gx is not None:
        # fold is the adjoint of unfold: overlapping patches sum, as the exact gradient does.
        gx = gx.reshape(ctx.x_shape[0], -1, gx.shape[1]).transpose(1, 2)
        gx = F.fold(gx, ctx.x_shape[-2:], ctx.w_shape[-2:], dilation, padding, stride)
    if gw is not None:
        gw = gw.reshape(ctx.w_shape)
    return (gx, gw, gb) + (None,) * 12


conv_fwd = _def("conv_fwd(Tensor x, Tensor w, Tensor? b, int key, int[] stride, int[] padding, "
                "int[] dilation, bool need_gx, bool need_gw, bool exact, int seq, int rank, "
                "int bits, bool row, bool recompute) -> (Tensor, Tensor, Tensor)",
                _conv_fwd, _conv_fwd_fake)


class _ConvFn(torch.autograd.Function):
    """hot::conv_fwd with its backward (hot::layer_bwd, then F.fold)."""

    forward = staticmethod(conv_fwd)
    setup_context = staticmethod(_conv_setup)
    backward = staticmethod(_conv_backward)


# ---------------------------------------------------------------- shared backward


def _setup_common(ctx, saved, w2d, key, exact, seq, need_gx, need_gw, in_features, x_dtype,
                  w_dtype, recompute):
    ctx.n_saved, ctx.recompute = len(saved), recompute
    ctx.save_for_backward(*saved, *((w2d,) if w2d is not None else ()))
    ctx.key, ctx.exact, ctx.seq = key, exact, seq
    ctx.need_gx, ctx.need_gw, ctx.in_features = need_gx, need_gw, in_features
    ctx.x_dtype, ctx.w_dtype = dtype_name(x_dtype), dtype_name(w_dtype)


def _backward_2d(ctx, gy2d, unfold=None):
    """(g_x as L x in_features, g_W as O x in_features, g_b) from hot::layer_bwd; None where not
    needed. ``unfold`` turns a kept conv input into the rows layer_bwd quantizes (recompute)."""
    t = ctx.saved_tensors
    saved = list(t[: ctx.n_saved]) + [None] * (2 - ctx.n_saved)
    if unfold is not None and ctx.need_gw:
        saved[0] = unfold(saved[0])
    w2d = t[ctx.n_saved] if ctx.need_gx else None
    need_gb = ctx.has_bias and ctx.needs_input_grad[2]
    gx, gw, gb = layer_bwd(gy2d, w2d, saved[0], saved[1], ctx.key, ctx.exact, ctx.seq,
                           ctx.need_gx, ctx.need_gw, need_gb, ctx.in_features, ctx.x_dtype,
                           ctx.w_dtype, ctx.recompute)
    return (gx if ctx.need_gx else None), (gw if ctx.need_gw else None), (gb if need_gb else None)


def _layer_bwd(gy2d: torch.Tensor, w2d: Optional[torch.Tensor], saved0: Optional[torch.Tensor],
              saved1: Optional[torch.Tensor], key: int, exact: bool, seq: int, need_gx: bool,
              need_gw: bool, need_gb: bool, in_features: int, x_dtype: str,
              w_dtype: str, recompute: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layer = _layer(key)
    # The plan hot_backward needs: its ABC seed is the forward's (used here only to recompute
    # the ABC copy); the live config is the one the forward op checked (a set_config between
    # forward and backward is the caller's choice, as in eager mode where the forward's plan is
    # kept: here the backward reads it again).
    seed_x = int(saved1[0]) if recompute and need_gw else 0
    plan = LayerPlan(layer.hot_config, layer._backend_for(gy2d.device), exact, seq, seed_x)
    saved = (saved0,) if exact else (saved0, saved1)
    with no_autocast(gy2d.device.type):
        if recompute and need_gw:
            saved = abc_save(plan, saved0)
        gx, gw, gb = hot_backward(layer, plan, gy2d, w2d, saved if need_gw else (), need_gx,
                                  need_gw, ops._DTYPES[x_dtype], ops._DTYPES[w_dtype], need_gb)
    if gb is None:
        gb = gy2d.sum(0) if need_gb else _empty(gy2d)
    return (gx.contiguous() if gx is not None else _empty(gy2d),
            gw.contiguous() if gw is not None else _empty(gy2d), gb)


def _layer_bwd_fake(gy2d, w2d, saved0, saved1, key, exact, seq, need_gx, need_gw, need_gb,
                    in_features, x_dtype, w_dtype, recompute):
    n, o = gy2d.shape
    gx = gy2d.new_empty((n, in_features), dtype=ops._DTYPES[x_dtype]) if need_gx else _empty(gy2d)
    gw = gy2d.new_empty((o, in_features), dtype=ops._DTYPES[w_dtype]) if need_gw else _empty(gy2d)
    gb = gy2d.new_empty((o,)) if need_gb else _empty(gy2d)
    return gx, gw, gb


layer_bwd = _def("layer_bwd(Tensor gy2d, Tensor? w2d, Tensor? saved0, Tensor? saved1, int key, "
                 "bool exact, int seq, bool need_gx, bool need_gw, bool need_gb, "
                 "int in_features, str x_dtype, str w_dtype, bool recompute) "
                 "-> (Tensor, Tensor, Tensor)", _layer_bwd, _layer_bwd_fake)


# ---------------------------------------------------------------- traced entry points


def _flags(layer, x: torch.Tensor, w: torch.Tensor, seq: int):
    """(need_gx, need_gw, exact, seq, rank, bits, row): the constants a graph is traced for."""
    h = layer.hot_config.hla
    return (x.requires_grad, w.requires_grad, layer._hot_exact_phase, seq, h.rank, h.bits or 0,
            h.scale == "channel")


def _recompute(layer) -> bool:
    """The ABC mode a graph is traced for. "auto" recomputes when the partitioner may rebuild
    what backward materializes (else it would save x itself, which the codes undercut)."""
    abc = layer.hot_config.hla.abc
    if abc == "auto":
        import torch._functorch.config as fc

        return not fc.ban_recompute_materialized_backward
    return abc == "recompute"


def linear(layer, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
           seq: int) -> torch.Tensor:
    """HOTLinear's forward while compiling (inputs validated and autocast-cast by the caller)."""
    x2d = x.reshape(-1, x.shape[-1])
    y2d, _, _ = _LinearFn.apply(x2d, w, b, layer._hot_key, *_flags(layer, x, w, seq),
                                _recompute(layer))
    return y2d.reshape(*x.shape[:-1], y2d.shape[-1])


def conv2d(layer, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], geom,
           seq: int) -> torch.Tensor:
    """HOTConv2d's forward while compiling; geom = (stride, padding, dilation)."""
    stride, padding, dilation = (list(g) for g in geom)
    y, _, _ = _ConvFn.apply(x, w, b, layer._hot_key, stride, padding, dilation,
                            *_flags(layer, x, w, seq), _recompute(layer))
    return y
