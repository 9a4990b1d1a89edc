"""The autograd Functions of HOT layers, one per layer type, used eagerly and under torch.compile.

A HOT layer's backward reads and advances per-layer state on every call (step counter, seeds,
LQS), which a traced graph would freeze into constants. So the HOT work sits inside
operators declared with torch.library, opaque to the compiler, whose Python bodies read that
state at run time:

    hot::linear_fwd(x2d, W, b, key, need_gx, need_gw, exact, seq, rank, bits, row, recompute,
                    draw, qfwd, offload)
        -> (y2d = x2d W^T + b, q_x, s_x, step)   (qfwd: y2d from INT8 operands, hot.nn.forward)
                                             q_x, s_x = the ABC codes (empty when not kept);
                                             step = a copy of the layer's step counter as of
                                             this call with recompute (x2d is kept instead of
                                             the codes) or a drawn HLA selection (draw), else
                                             empty; offload: q_x in pinned host memory
                                             (hot.nn.offload), brought back by layer_bwd
    hot::conv_fwd(x, W, b, key, stride, padding, dilation, <same flags>)
        -> (y = conv2d(x, W, b), q_x, s_x)   ABC of the unfolded patches (or the patches
                                             themselves while exact; with recompute, x is kept,
                                             and backward unfolds it)
    hot::layer_bwd(g_y2d, W2d, saved0, saved1, fwd_step, key, cfg_key, exact, seq, need_gx,
                  need_gw, need_gb, in_features, x_dtype, w_dtype, recompute)
        -> (g_x2d, g_W2d, g_b)   (empty when not needed; saved0, saved1 = the ABC codes, or x2d
                                  with recompute: the codes are formed here with the forward's
                                  step fwd_step, whose seeds a drawn selection's backward
                                  follows too; cfg_key names the forward's config, which
                                  backward runs with)

and, for Linear layers under HLAConfig(share="siblings") (hot.nn.groups), the forward split in
two so that sibling layers reading one x share the pass over it:

    hot::x_codes(x2d, source key, seq, rank, bits, row, draw, qfwd, recompute, offload)
        -> (codes of x for the quantized forward GEMM, q_x, s_x, step)   (the source's seeds)
    hot::coded_fwd(x2d, W, b, those codes, key, <linear_fwd's flags>) -> y2d

``LinearFn`` / ``ConvFn`` wire them: forward runs the forward operator and keeps what backward
needs (one convention for both layer types: the ABC codes, or x while exact or
recomputing), backward runs hot::layer_bwd. The backward is not itself differentiable
(once_differentiable): a double backward through a HOT layer raises instead of returning the
wrong Hessian-vector product. The one switch between eager and traced use is
``_call``: while dynamo traces, the operators go into the graph; eagerly their bodies are called
directly (the torch.library dispatcher would add 20-40 us of host time per call and nothing
else). Reshapes and F.fold stay outside the operators, in traced code.

``key`` is a per-layer constant: an int naming the layer in a registry of weak references, so
dynamo bakes it into the graph and no step recompiles. Everything that fixes the saved tensors'
shapes is an explicit constant argument read from the layer while tracing (dynamo guards on
each value): HLA rank / bits / scale, the blocking length ``seq``, which gradients are needed,
and the phase ``exact`` (a bool that flips at most twice, so the end of ``exact_steps`` and the
start of ``exact_from`` recompile once each, while the step counter never does). The operators
check these constants against the layer's live state and raise on a stale graph instead of
computing with the wrong plan.

Operators that are not ATen builtins are never recomputed in backward by AOT autograd's
partitioner, so each forward operator runs once per call (its ABC happens once, as in eager
mode). With HLAConfig.abc "recompute" (and "auto" traced while
``torch._functorch.config.ban_recompute_materialized_backward`` is False) the forward keeps
x2d, a plain tensor the partitioner may rebuild in backward from what other ops keep; the
forward's step travels as a one-element tensor, so backward forms the codes eager mode's
forward would.
CUDA graphs (torch.compile(mode="reduce-overhead"), or a step captured by torch.cuda.graph)
capture the operators' kernels: the seeds follow the step counter in device memory, which a
captured device operation advances, and nothing in them waits for the host. What the host
decides (the exact and INT8 phases, LQS's choice, the backend) is fixed at capture, so
capturing a layer that would still change one of them raises (``_check_capturable``).
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
import weakref
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..common import ops
from ..common.config import ABC_BACKWARDS
from . import replay
from .backward import (abc_codes, gw_dtype, hla_args, hot_backward, kept_by_producer,
                       no_autocast, pads_sequences, patches, seq_pad, splits_gy_pass)
from .forward import coded_gemm, forward_args, quantized_gemm, row_codes
from .groups import abc_source
from .offload import get as offload_get, put as offload_put
from .state import (ABC_X, DRAW, LayerPlan, config_of, draws_rows, hla_history, is_narrow,
                    layer_seed, make_plan)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "float64": torch.float64}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}

# torch.library.Library rather than torch.library.custom_op: custom_op's autograd wrapper (a
# no-grad redispatch), dynamo-disable wrapper and output alias check cost about 60 us of host
# time per call even inside a compiled graph; here the dispatcher calls the Python body directly.
_LIB = torch.library.Library("hot", "FRAGMENT")


def _def(schema: str, fn, fake, tags: tuple = ()):
    """Declare hot::<schema> with ``fn`` as its kernel on every device and ``fake`` for tracing."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema, tags=tags)
    # Per device, not CompositeExplicitAutograd (which would also serve meta tensors: the body
    # reads live layer state and must never run while tracing).
    for key in ("CPU", "CUDA", "XPU", "MPS"):
        _LIB.impl(name, fn, key)
    torch.library.register_fake("hot::" + name, fake, lib=_LIB)
    return getattr(torch.ops.hot, name).default


def _call(op, impl, *args):
    """The one eager / traced switch: the declared operator while dynamo traces, else its body."""
    return op(*args) if torch.compiler.is_compiling() else impl(*args)


_LAYERS: "weakref.WeakValueDictionary[int, torch.nn.Module]" = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)


def register(layer) -> int:
    """A fresh key naming ``layer`` (weakly) for the operators."""
    key = next(_KEYS)
    _LAYERS[key] = layer
    return key


def _layer(key: int):
    layer = _LAYERS.get(key)
    if layer is None:
        raise RuntimeError(
            f"HOT layer key {key} names a HOT layer that no longer exists: a compiled graph "
            f"outlived its model. Call torch._dynamo.reset() and compile again.")
    return layer


def _check_capturable(layer, device: torch.device) -> None:
    """Raise if a CUDA graph is being captured and ``layer`` would still change what the host
    decides per call (a replay would keep the captured choice): its exact or INT8 phase, LQS's
    calibration; or it runs the reference backend, whose quantizer reads values on the host."""
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        return
    if is_narrow(layer, layer.hot_config):
        return  # exact on every call: nothing the host decides per call, no LQS to calibrate
    cfg = layer.hot_config
    why = None
    if layer._backend_for(device) != "fast":
        why = "it runs the reference backend (use backend='fast')"
    elif layer.hot_step_value() < cfg.exact_steps + cfg.int8_steps:
        why = (f"it is at step {layer.hot_step_value()}, inside exact_steps + int8_steps = "
               f"{cfg.exact_steps + cfg.int8_steps}")
    elif cfg.exact_from is not None and layer.hot_step_value() < cfg.exact_from:
        # a replay would go on running HOT past the cool-down's start
        why = (f"it is at step {layer.hot_step_value()}, before its exact cool-down starts at "
               f"exact_from = {cfg.exact_from}")
    elif cfg.hq.bits and cfg.hq.gy_scale == "auto" and layer.hot_lqs_value() < 0:
        why = "LQS has not decided yet (calibration runs on the host)"
    elif cfg.hla.abc == "offload":
        why = ("HLAConfig(abc='offload') decides on the host which codes to copy when (use "
               "abc='save' or 'recompute' under CUDA graphs)")
    if why is not None:
        raise RuntimeError(
            f"HOT layer {layer.hot_name!r} cannot be captured in a CUDA graph: {why}. Run the "
            f"first steps without CUDA graphs (eagerly, or compiled without "
            f"mode='reduce-overhead'), then capture.")


def _empty(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(0)


def _live_plan(layer, x: torch.Tensor, seq: int, exact: bool, rank: int, bits: int,
               row: bool, recompute: bool, draw: bool, qfwd: bool, offload: bool) -> LayerPlan:
    """make_plan for this call, after checking the constants the caller passed (traced ones may
    be stale) against the layer's live state."""
    cfg = layer._hot_run_config
    plan = make_plan(layer, cfg, layer._backend_for(x.device), seq, x.numel() == 0)
    h = cfg.hla
    # "auto" was resolved by the caller (from the producer or the partitioner's flag): either is
    # live.
    live = (plan.exact, h.rank, h.bits or 0, h.scale == "channel",
            recompute if h.abc == "auto" else h.abc == "recompute", draws_rows(cfg),
            quantizes_forward(cfg, plan.exact), offloads(cfg, plan.exact, x))
    if live != (exact, rank, bits, row, recompute, draw, qfwd, offload):
        raise RuntimeError(
            f"HOT layer {layer.hot_name!r}: the compiled graph was traced for (exact, rank, bits, "
            f"per-channel scale, ABC recompute, drawn rows, quantized forward, ABC offload) = "
            f"{(exact, rank, bits, row, recompute, draw, qfwd, offload)} but the "
            f"layer now has {live}; this is a missing recompile: call torch._dynamo.reset() "
            f"and compile again.")
    return plan


def _start(key: int, x: torch.Tensor, *flags) -> tuple:
    """(layer, plan) of a forward operator's call: the live layer named by ``key``, checked for
    capture, and its plan checked against the call's traced ``flags`` (_live_plan's)."""
    layer = _layer(key)
    _check_capturable(layer, x.device)
    return layer, _live_plan(layer, x, *flags)


def _step_snapshot(layer) -> torch.Tensor:
    """The layer's step counter as the forward saw it (a device copy: backward forms the ABC codes
    and draws the HLA rows with the forward's seeds, whatever backwards ran in between, and a
    CUDA graph copies it)."""
    return layer.hot_step.clone()


def _step_fake(w: torch.Tensor) -> torch.Tensor:
    return w.new_empty((), dtype=torch.int64)


def _abc_fake(x2d: torch.Tensor, seq: int, rank: int, bits: int, row: bool) -> ops.Quantized:
    """Shapes of abc_codes' output (hot.common.ops.hla_fake)."""
    a = ops.HLAArgs(rank, "lowpass", bits, ops.ScaleMode.ROW if row else ops.ScaleMode.TENSOR,
                    False, 0)
    return ops.hla_fake(seq_pad(x2d, seq), a)


def _first_order(backward):
    """once_differentiable, and an error naming the layer where a higher-order gradient is
    asked for (the backward runs with grad mode on: create_graph=True). HOT's backward quantizes
    and has no derivative; PyTorch alone would answer a Hessian-vector product with None for
    every parameter (allow_unused=True) or a generic "not used in the graph" error."""
    inner = once_differentiable(backward)

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            layer = _LAYERS.get(ctx.key)
            name = layer.hot_name if layer is not None else "?"
            raise RuntimeError(
                f"HOT layer {name!r}: a higher-order gradient was asked for (create_graph=True: "
                f"double backward, a Hessian-vector product, a gradient penalty), but HOT's "
                f"backward is quantized and has no derivative. Compute it on the plain model "
                f"(hot.unconvert(model)) or leave these layers unconverted "
                f"(hot.convert(..., filter=...)).")
        return inner(ctx, *grads)

    return wrapper


# ---------------------------------------------------------------- linear


def quantizes_forward(cfg, exact: bool) -> bool:
    """Whether a call runs the quantized forward GEMM (HOTConfig.forward, outside the exact
    phases and narrow layers, which run exactly)."""
    return cfg.forward != "exact" and not exact


def offloads(cfg, exact: bool, x: torch.Tensor) -> bool:
    """Whether a call keeps its ABC codes in host memory (HLAConfig(abc="offload"), outside the
    exact phases, on a CUDA device: on a CPU they are there already)."""
    return cfg.hla.abc == "offload" and not exact and x.device.type == "cuda"


def _forward_gemm(plan: LayerPlan, rows: torch.Tensor, w2d: torch.Tensor,
                  b: Optional[torch.Tensor], codes: bool
                  ) -> tuple[torch.Tensor, Optional[ops.Quantized]]:
    """The quantized forward GEMM on ``rows`` (hot.nn.forward), y = rows W^T + b with the bias
    added in int_gemm_nt's epilogue (no add after the operator), and, with ``codes``, ABC's codes
    of rows from the same pass where one pass can form both: no sequence padding and no
    delayed history (else None: _abc_outputs forms them)."""
    return quantized_gemm(plan.config.forward, rows, w2d, b, plan.backend,
                          _fused_abc(plan, codes))


def _fused_abc(plan: LayerPlan, codes: bool) -> Optional[ops.HLAArgs]:
    """ABC's arguments where the quantized forward's pass over x also forms ABC's codes (asked
    for by ``codes``; no sequence padding, no delayed history), else None."""
    if codes and plan.x_hist is None and not pads_sequences(plan.seq):
        return hla_args(plan, plan.seed_x, None, plan.seed_draw)
    return None


def _linear_fwd(x2d: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], key: int,
                need_gx: bool, need_gw: bool, exact: bool, seq: int, rank: int, bits: int,
                row: bool, recompute: bool, draw: bool, qfwd: bool, offload: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    layer, plan = _start(key, x2d, seq, exact, rank, bits, row, recompute, draw, qfwd, offload)
    with no_autocast(x2d.device.type):
        keep = need_gw and not exact
        codes = None
        if qfwd:
            y, codes = _forward_gemm(plan, x2d, w, b, keep and not recompute)
        else:
            y = F.linear(x2d, w.to(x2d.dtype), b)
        if keep:
            return (y, *_abc_outputs(layer, plan, x2d, recompute, draw, codes, offload))
    # While exact, x2d itself is kept (LinearFn.forward saves the input: no copy).
    return y, _empty(y), _empty(y), _empty(y)


def _abc_outputs(layer, plan: LayerPlan, rows: torch.Tensor, recompute: bool, draw: bool,
                 codes: Optional[ops.Quantized] = None, offload: bool = False):
    """(q_x, s_x, step) of a forward that keeps what HOT's g_W path needs of ``rows``;
    ``codes``: ABC's codes already formed (by the quantized forward's pass over rows);
    ``offload``: q_x in pinned host memory (hot.nn.offload), s_x on the GPU."""
    if recompute:  # the Function keeps x: backward forms the codes
        return _empty(rows), _empty(rows), _step_snapshot(abc_source(layer))
    if codes is not None:
        q, s = codes
    elif plan.x_hist is not None:
        # A delayed x history: a re-run of this forward (activation checkpointing) reads what
        # the first run read (hot.nn.replay).
        q, s = replay.delayed_x_codes(layer, plan, rows)
    else:
        q, s = abc_codes(plan, rows)
    q = q.contiguous()
    return (offload_put(q) if offload else q, s.contiguous(),
            _step_snapshot(abc_source(layer)) if draw else _empty(rows))


def _abc_outputs_fake(w, rows, seq, rank, bits, row, recompute, draw, offload=False):
    if recompute:
        return _empty(rows), _empty(rows), _step_fake(w)
    q, s = _abc_fake(rows, seq, rank, bits, row)
    if offload:
        q = torch.empty(q.shape, dtype=q.dtype, device="cpu")
    return q, s, _step_fake(w) if draw else _empty(rows)


def _as(b: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    # A fake's bias in x's dtype: with a quantized forward the operator takes it as float32
    # (_gemm_bias), and y comes out in x's dtype all the same.
    return b.to(x.dtype) if b is not None else None


def _linear_fwd_fake(x2d, w, b, key, need_gx, need_gw, exact, seq, rank, bits, row, recompute,
                     draw, qfwd, offload):
    y = F.linear(x2d, w.to(x2d.dtype), _as(b, x2d))
    if need_gw and not exact:
        return (y, *_abc_outputs_fake(w, x2d, seq, rank, bits, row, recompute, draw, offload))
    return y, _empty(y), _empty(y), _empty(y)


linear_fwd = _def("linear_fwd(Tensor x2d, Tensor w, Tensor? b, int key, bool need_gx, "
                  "bool need_gw, bool exact, int seq, int rank, int bits, bool row, "
                  "bool recompute, bool draw, bool qfwd, bool offload) "
                  "-> (Tensor, Tensor, Tensor, Tensor)", _linear_fwd, _linear_fwd_fake)


# ---------------------------------------------------------------- shared x codes (HLAConfig.share)


def _x_codes(x2d: torch.Tensor, key: int, seq: int, rank: int, bits: int, row: bool, draw: bool,
             qfwd: bool, recompute: bool, offload: bool) -> tuple[torch.Tensor, ...]:
    """hot::x_codes: the pass over x of the layer named by ``key`` (a group source,
    hot.nn.groups), apart from any GEMM: (its codes for the quantized forward GEMM, or empty;
    ABC's codes q, s, empty with recompute; the source's step with recompute or drawn rows, else
    empty), what that layer's own forward operator forms of x (hot::linear_fwd). Its arguments
    name x and the source alone, so the calls of layers that read one x are one expression,
    which AOT autograd's common-subexpression elimination runs once."""
    layer, plan = _start(key, x2d, seq, False, rank, bits, row, recompute, draw, qfwd, offload)
    with no_autocast(x2d.device.type):
        qx = codes = None
        if qfwd:  # as _linear_fwd: one pass forms both where it can
            qx, codes = row_codes(plan.config.forward, x2d, plan.backend,
                                  _fused_abc(plan, not recompute))
        q, s, step = _abc_outputs(layer, plan, x2d, recompute, draw, codes, offload)
    if qx is None:  # a custom operator's outputs may not alias each other: one empty each
        qx = ops.Quantized(_empty(x2d), _empty(x2d))
    return qx.q, qx.scale, q, s, step


def _x_codes_fake(x2d, key, seq, rank, bits, row, draw, qfwd, recompute, offload):
    # the shapes of the one quantized forward's codes (hot.nn.forward.FORWARD_BITS)
    qx = (ops.hq_fake(x2d, forward_args("int8")) if qfwd
          else ops.Quantized(_empty(x2d), _empty(x2d)))
    if recompute:
        return qx.q, qx.scale, _empty(x2d), _empty(x2d), _step_fake(x2d)
    q, s, step = _abc_outputs_fake(x2d, x2d, seq, rank, bits, row, False, draw, offload)
    return qx.q, qx.scale, q, s, step


x_codes = _def("x_codes(Tensor x2d, int key, int seq, int rank, int bits, bool row, bool draw, "
               "bool qfwd, bool recompute, bool offload) "
               "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
               _x_codes, _x_codes_fake)


def _coded_fwd(x2d: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], qx: torch.Tensor,
               sx: torch.Tensor, key: int, need_gx: bool, need_gw: bool, exact: bool, seq: int,
               rank: int, bits: int, row: bool, recompute: bool, draw: bool, qfwd: bool,
               offload: bool) -> torch.Tensor:
    """hot::coded_fwd: y = x2d W^T + b of the layer named by ``key``, from x's codes (qx, sx:
    hot::x_codes) with a quantized forward, else exactly."""
    _, plan = _start(key, x2d, seq, exact, rank, bits, row, recompute, draw, qfwd, offload)
    with no_autocast(x2d.device.type):
        if qfwd:
            return coded_gemm(plan.config.forward, ops.Quantized(qx, sx), w, b, plan.backend,
                              x2d.dtype)
        return F.linear(x2d, w.to(x2d.dtype), b)


def _coded_fwd_fake(x2d, w, b, qx, sx, key, need_gx, need_gw, exact, seq, rank, bits, row,
                    recompute, draw, qfwd, offload):
    return F.linear(x2d, w.to(x2d.dtype), _as(b, x2d))


coded_fwd = _def("coded_fwd(Tensor x2d, Tensor w, Tensor? b, Tensor qx, Tensor sx, int key, "
                 "bool need_gx, bool need_gw, bool exact, int seq, int rank, int bits, bool row, "
                 "bool recompute, bool draw, bool qfwd, bool offload) -> Tensor", _coded_fwd,
                 _coded_fwd_fake)


_LAST_CODES = threading.local()  # eagerly: the last hot::x_codes call (_shared_x_codes)


def _data_token(x: torch.Tensor, *extra) -> tuple:
    """Names the data of ``x`` as long as the token's weak reference to x's base tensor is alive
    (its memory cannot be reused meanwhile): x's address, shape, strides, dtype, device and
    version (bumped by every in-place change), with ``extra``. Eager use only."""
    base = x._base if x._base is not None else x
    return ((x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device, x._version, *extra),
            weakref.ref(base))


def _shared_x_codes(x2d: torch.Tensor, src: int, f: "CallFlags",
                    token: Optional[tuple]) -> tuple[torch.Tensor, ...]:
    """hot::x_codes of x2d for the group source ``src``. Eagerly (``token``: _data_token of the
    tensor x2d was made from, before autocast's cast, with the source's step and config) the
    previous call's outputs when it had the same source, token and shape: the same codes, as
    the seeds follow that step; traced, the compiler merges equal calls itself."""
    args = (x2d, src, f.seq, f.rank, f.bits, f.row, f.draw, f.qfwd, f.recompute, f.offload)
    if token is None:
        return _call(x_codes, _x_codes, *args)
    key = (token[0], args[1:], tuple(x2d.shape), x2d.dtype)
    return _last_or(_LAST_CODES, key, (token[1],), lambda: _x_codes(*args))


def _last_or(store: threading.local, key: tuple, refs: tuple, compute):
    """Eagerly, the result ``store`` kept of the last call when that call had ``key`` and the
    same live objects as the weak references ``refs``; else ``compute()``, kept in its place."""
    last = getattr(store, "entry", None)
    if last is not None and last[0] == key and \
            all(a() is not None and a() is b() for a, b in zip(last[1], refs)):
        return last[2]
    out = compute()
    store.entry = (key, refs, out)
    return out


def _codes_source(layer, f: "CallFlags"):
    """The layer whose hot::x_codes forms this call's x codes, shared with the calls of its
    sibling layers (HLAConfig.share "siblings": hot.nn.groups), or None: the layer's own
    forward operator forms them (nothing to share: no codes formed). With recompute the source's
    step is shared instead (and the quantized forward's codes), and an eager backward forms x's
    codes once for the siblings too (_shared_bwd_codes)."""
    if layer._hot_run_config.hla.share != "siblings" or not f.need_gw or f.exact:
        return None
    return abc_source(layer)


class CallFlags(NamedTuple):
    """The constants of one HOT layer call, read from the layer (while tracing, dynamo guards on
    each): the config backward runs with, which gradients are needed, and what fixes the saved
    tensors' shapes. Everything after ``cfg_key`` is, in order, the forward operators'
    arguments after the data (hot::linear_fwd, hot::conv_fwd)."""

    cfg_key: int  # names the config the backward runs with (state.config_key)
    need_gx: bool
    need_gw: bool
    exact: bool  # the exact phase: x is kept, gradients are autograd's
    seq: int  # rows per sequence for blocking "sequence", else 0
    rank: int  # HLA's rank, bits (0: none) and per-channel scales
    bits: int
    row: bool
    recompute: bool  # the ABC codes are formed in backward from a kept x
    draw: bool  # HLA's rows are drawn (the forward keeps its step)
    qfwd: bool  # the forward GEMM runs on quantized operands (HOTConfig.forward)
    offload: bool  # the ABC codes are kept in host memory (HLAConfig.abc "offload")


class LinearFn(torch.autograd.Function):
    """hot::linear_fwd with its backward (hot::layer_bwd)."""

    # forward(ctx, ...) rather than forward + setup_context: Function.apply binds the arguments
    # of a setup_context Function through inspect.signature on every call (host time).
    @staticmethod
    def forward(ctx, x2d, w, b, key, f: CallFlags, src: int = 0, token: Optional[tuple] = None):
        if src:  # x's codes from hot::x_codes of the group source ``src`` (_codes_source)
            xq, xs, q, s, step = _shared_x_codes(x2d, src, f, token)
            out = (_call(coded_fwd, _coded_fwd, x2d, w, b, xq, xs, key, *f[1:]), q, s, step)
        else:
            out = _call(linear_fwd, _linear_fwd, x2d, w, b, key, *f[1:])
        _setup_common(ctx, out, x2d, w if f.need_gx else None, key, f, x2d.shape[1], x2d.dtype,
                      w.dtype, b is not None, src)
        return out

    @staticmethod
    @_first_order
    def backward(ctx, gy2d, _gq, _gs, _gstep):
        gx, gw, gb = _backward_2d(ctx, gy2d)
        return gx, gw, gb, None, None, None, None


# ---------------------------------------------------------------- conv2d


def _conv_fwd(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], key: int,
              stride: list[int], padding: list[int], dilation: list[int], need_gx: bool,
              need_gw: bool, exact: bool, seq: int, rank: int, bits: int,
              row: bool, recompute: bool, draw: bool, qfwd: bool, offload: bool
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    layer, plan = _start(key, x, seq, exact, rank, bits, row, recompute, draw, qfwd, offload)
    with no_autocast(x.device.type):
        rows = codes = None
        if qfwd:  # the GEMM over the patches: y as its (B Ho Wo, O) output (ConvFn lays it out)
            # The bias of output channel o is the GEMM's column bias of column o: its epilogue
            # adds it, once.
            rows = patches(x, w.shape[-2:], stride, padding, dilation)
            y, codes = _forward_gemm(plan, rows, w.reshape(w.shape[0], -1), b,
                                     need_gw and not recompute)
        else:
            y = F.conv2d(x, w.to(x.dtype), b, stride, padding, dilation)
        if not need_gw:
            return y, _empty(y), _empty(y), _empty(y)
        if recompute and not exact:  # ConvFn.forward keeps x
            return y, _empty(y), _empty(y), _step_snapshot(layer)
        if rows is None:
            rows = patches(x, w.shape[-2:], stride, padding, dilation)
        if exact:  # the patches themselves (a transient of kh*kw times x)
            return y, _own_copy(rows.contiguous(), x), _empty(y), _empty(y)
        return (y, *_abc_outputs(layer, plan, rows, False, draw, codes, offload))


def _own_copy(t: torch.Tensor, of: torch.Tensor) -> torch.Tensor:
    """``t``, copied where it shares memory with ``of``: a custom operator's output may not alias
    its input (a 1x1 convolution's patches of a channels-last x are a view of x)."""
    if t.untyped_storage().data_ptr() == of.untyped_storage().data_ptr():
        return t.clone()
    return t


def conv_out_hw(x_shape, w_shape, stride, padding, dilation) -> tuple[int, int]:
    """(Ho, Wo) of conv2d over an input of ``x_shape`` (..., H, W) with a kernel of ``w_shape``."""
    return tuple((x_shape[-2 + i] + 2 * padding[i] - dilation[i] * (w_shape[-2 + i] - 1) - 1)
                 // stride[i] + 1 for i in (0, 1))


def _conv_fwd_fake(x, w, b, key, stride, padding, dilation, need_gx, need_gw, exact, seq, rank,
                   bits, row, recompute, draw, qfwd, offload):
    y = F.conv2d(x, w.to(x.dtype), _as(b, x), stride, padding, dilation)
    n_rows = y.shape[0] * y.shape[2] * y.shape[3]  # one patch, one GEMM row per output position
    if qfwd:  # the GEMM's rows (B Ho Wo, O)
        y = y.new_empty((n_rows, y.shape[1]))
    if not need_gw:
        return y, _empty(y), _empty(y), _empty(y)
    if recompute and not exact:
        return y, _empty(y), _empty(y), _step_fake(w)
    rows = x.new_empty((n_rows, w[0].numel()))
    if exact:
        return y, rows, _empty(y), _empty(y)
    return (y, *_abc_outputs_fake(w, rows, seq, rank, bits, row, False, draw, offload))


conv_fwd = _def("conv_fwd(Tensor x, Tensor w, Tensor? b, int key, int[] stride, int[] padding, "
                "int[] dilation, bool need_gx, bool need_gw, bool exact, int seq, int rank, "
                "int bits, bool row, bool recompute, bool draw, bool qfwd, bool offload) "
                "-> (Tensor, Tensor, Tensor, Tensor)", _conv_fwd, _conv_fwd_fake)


class ConvFn(torch.autograd.Function):
    """hot::conv_fwd with its backward (hot::layer_bwd, then F.fold)."""

    @staticmethod
    def forward(ctx, x, w, b, key, stride, padding, dilation, f: CallFlags):
        out = _call(conv_fwd, _conv_fwd, x, w, b, key, stride, padding, dilation, *f[1:])
        if f.qfwd:
            # The GEMM's (B Ho Wo, O) rows as (B, O, Ho, Wo), as F.conv2d lays them out. Here,
            # outside the opaque operator, torch.compile fuses this copy into its consumer (a
            # patch embedding's flatten and transpose undo it: no copy at all).
            ho, wo = conv_out_hw(x.shape, w.shape, stride, padding, dilation)
            y = out[0].reshape(x.shape[0], ho, wo, -1).permute(0, 3, 1, 2).contiguous()
            out = (y, *out[1:])
        # while exact, the patches (in q's place) are what backward needs of x
        _setup_common(ctx, out, None if f.exact else x, w.reshape(w.shape[0], -1) if f.need_gx
                      else None, key, f, w[0].numel(), x.dtype, w.dtype, b is not None)
        ctx.geom = (tuple(stride), tuple(padding), tuple(dilation))
        ctx.x_shape, ctx.w_shape = tuple(x.shape), tuple(w.shape)
        return out

    @staticmethod
    @_first_order
    def backward(ctx, gy, _gq, _gs, _gstep):
        stride, padding, dilation = ctx.geom
        gy2d = gy.permute(0, 2, 3, 1).reshape(-1, gy.shape[1])
        unfold = None
        if ctx.recompute:  # the patches of the kept x, for layer_bwd's ABC
            unfold = lambda x: patches(x, ctx.w_shape[-2:], stride, padding, dilation)  # noqa: E731
        gx, gw, gb = _backward_2d(ctx, gy2d, unfold)
        if gx is not None:
            # fold is the adjoint of unfold: overlapping patches sum, as the exact gradient does.
            positions = gy.shape[2] * gy.shape[3]
            gx = gx.reshape(ctx.x_shape[0], positions, gx.shape[1]).transpose(1, 2)
            gx = F.fold(gx, ctx.x_shape[-2:], ctx.w_shape[-2:], dilation, padding, stride)
        if gw is not None:
            gw = gw.reshape(ctx.w_shape)
        return gx, gw, gb, None, None, None, None, None


# ---------------------------------------------------------------- shared backward


def _setup_common(ctx, out, x, w2d, key, f: CallFlags, in_features, x_dtype, w_dtype,
                  has_bias, src: int = 0):
    """Keep what backward needs: of x (when need_gw), x itself while exact (a conv's patches,
    out's q, in its place: ``x`` None), x and the forward's step with recompute, else the ABC
    codes (q, s) and, for a drawn selection, the forward's step; then W when need_gx. ``src``:
    the group source whose hot::x_codes gave ``out``'s codes and step (_codes_source), or 0."""
    _, q, s, step = out
    ctx.mark_non_differentiable(q, s, step)
    # q, s and step get no gradient: do not let autograd materialize zeros of their shapes for
    # backward (an allocation and a memset of the codes' size per call).
    ctx.set_materialize_grads(False)
    recompute = f.recompute and not f.exact
    if not f.need_gw:
        saved = ()
    elif f.exact:
        saved = (q,) if x is None else (x,)
    elif recompute:
        saved = (x, None, step)
    else:
        saved = (q, s, step) if f.draw else (q, s)
    ctx.n_saved, ctx.recompute = len(saved), recompute
    ctx.save_for_backward(*saved, *((w2d,) if w2d is not None else ()))
    ctx.key, ctx.cfg, ctx.exact, ctx.seq = key, f.cfg_key, f.exact, f.seq
    ctx.need_gx, ctx.need_gw, ctx.in_features = f.need_gx, f.need_gw, in_features
    ctx.x_dtype, ctx.w_dtype = _DTYPE_NAMES[x_dtype], _DTYPE_NAMES[w_dtype]
    ctx.has_bias, ctx.src = has_bias, src
    ctx.traced = torch.compiler.is_compiling()
    # The record of what a delayed x history's pass read, kept as long as this node (eagerly:
    # a traced forward never runs again in backward).
    ctx.x_pass = None
    if f.need_gw and not (f.exact or recompute or ctx.traced) \
            and config_of(f.cfg_key).hla.amax == "delayed":
        ctx.x_pass = replay.take_last()


def _backward_2d(ctx, gy2d, unfold=None):
    """(g_x as L x in_features, g_W as O x in_features, g_b) from hot::layer_bwd; None where not
    needed. ``unfold`` turns a kept conv input into the rows layer_bwd quantizes (recompute)."""
    t = ctx.saved_tensors
    saved = list(t[: ctx.n_saved]) + [None] * (3 - ctx.n_saved)  # codes or x, and the step
    recompute = ctx.recompute
    if unfold is not None and ctx.need_gw:
        saved[0] = unfold(saved[0])
    elif recompute and ctx.need_gw and ctx.traced:
        saved[0] = _fusible_copy(saved[0])
    if recompute and ctx.need_gw and ctx.src and not ctx.traced \
            and config_of(ctx.cfg).method in ABC_BACKWARDS:
        # x's codes as the source's backward forms them, once for the siblings reading x
        saved[0], saved[1] = _shared_bwd_codes(ctx, saved[0], saved[2])
        recompute = False
    w2d = t[ctx.n_saved] if ctx.need_gx else None
    need_gb = ctx.has_bias and ctx.needs_input_grad[2]
    args = (gy2d, w2d, saved[0], saved[1], saved[2], ctx.key, ctx.cfg, ctx.exact, ctx.seq,
            ctx.need_gx, ctx.need_gw, need_gb, ctx.in_features, ctx.x_dtype, ctx.w_dtype,
            recompute)
    gx, gw, gb = layer_bwd(*args) if ctx.traced else _layer_bwd(*args)
    if ctx.x_pass is not None:
        ctx.x_pass.done = True  # a later forward inside a backward is no re-run of this one
    return (gx if ctx.need_gx else None), (gw if ctx.need_gw else None), (gb if need_gb else None)


def _fusible_copy(x: torch.Tensor) -> torch.Tensor:
    """x, exactly, through elementwise ops a traced backward keeps (-(-x)). AOT autograd's
    default partitioner (ban_recompute_materialized_backward=True) never rebuilds in backward a
    tensor that an opaque operator (hot::layer_bwd) reads there; read through an elementwise op
    it may, from what the producer's own backward keeps (a norm's input, an activation's
    inputs), fused with this copy. A clone or ``x + 0`` would be removed as no-ops first."""
    return x.neg().neg()


def _layer_bwd(gy2d: torch.Tensor, w2d: Optional[torch.Tensor], saved0: Optional[torch.Tensor],
               saved1: Optional[torch.Tensor], fwd_step: Optional[torch.Tensor], key: int,
               cfg_key: int, exact: bool, seq: int,
               need_gx: bool,
               need_gw: bool, need_gb: bool, in_features: int, x_dtype: str,
               w_dtype: str, recompute: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    layer = _layer(key)
    _check_capturable(layer, gy2d.device)
    # The forward's config (``cfg_key``), not the layer's live one: a set_config between a
    # forward and its backward applies from the next forward (the saved tensors, the method and
    # the delayed histories belong to the forward's). fwd_step: the step counter as the forward
    # saw it (with recompute, or drawn rows).
    cfg = config_of(cfg_key)
    plan = _backward_plan(layer, cfg, gy2d.device, exact, seq, need_gw, recompute, fwd_step)
    saved = None
    if need_gw and not exact and saved0.device != gy2d.device:  # HLAConfig(abc="offload")
        saved0 = offload_get(saved0, gy2d.device, prefetch=not splits_gy_pass(gy2d))
    if need_gw:
        saved = saved0 if exact else ops.Quantized(saved0, saved1)
    with no_autocast(gy2d.device.type):
        # int4 and luq quantize x itself; HOT and LBP-WHT work on x's HLA codes
        if recompute and need_gw and cfg.method in ABC_BACKWARDS:
            saved = abc_codes(plan, saved0)
        elif recompute and need_gw:
            saved = saved0
        gx, gw, gb = hot_backward(layer, plan, gy2d, w2d, saved, need_gx, need_gw,
                                  _DTYPES[x_dtype], gw_dtype(gy2d, _DTYPES[w_dtype]), need_gb)
    return (gx.contiguous() if gx is not None else _empty(gy2d),
            gw.contiguous() if gw is not None else _empty(gy2d),
            gb if gb is not None else _empty(gy2d))


def _backward_plan(layer, cfg, device: torch.device, exact: bool, seq: int, need_gw: bool,
                   recompute: bool, fwd_step: Optional[torch.Tensor]) -> LayerPlan:
    """The LayerPlan of a backward with the forward's config ``cfg`` and step ``fwd_step``
    (with recompute, or drawn rows): x's codes and the drawn rows follow the group source's
    seeds (hot.nn.groups)."""
    src = abc_source(layer)
    seed_x = 0
    if recompute and need_gw and cfg.hla.bits and cfg.hla.rounding == "stochastic":
        seed_x = layer_seed(src, cfg, ABC_X, None, fwd_step)
    x_hist = None
    if recompute and need_gw and not exact:
        x_hist = hla_history(layer, cfg, ABC_X, device)
    draw = 0
    if draws_rows(cfg) and need_gw and not exact:
        draw = layer_seed(src, cfg, DRAW, None, fwd_step)
    return LayerPlan(cfg, layer._backend_for(device), exact, seq, seed_x, x_hist, draw, fwd_step)


def _bwd_codes(x2d: torch.Tensor, step: torch.Tensor, key: int, cfg_key: int, seq: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """ABC's codes of a kept x2d as the backward of the layer named by ``key`` (a group source)
    forms them with recompute, for its forward at ``step`` with config ``cfg_key``: the codes
    hot::layer_bwd would form of x2d for any of its siblings (their seeds are the source's)."""
    layer = _layer(key)
    _check_capturable(layer, x2d.device)
    plan = _backward_plan(layer, config_of(cfg_key), x2d.device, False, seq, True, True, step)
    with no_autocast(x2d.device.type):
        q, s = abc_codes(plan, x2d)
    return q.contiguous(), s.contiguous()


_LAST_BWD_CODES = threading.local()  # eagerly: the last _bwd_codes call (_shared_bwd_codes)


def _shared_bwd_codes(ctx, x2d: torch.Tensor, step: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eagerly, _bwd_codes of a sibling's kept x2d: the previous call's codes when it read the
    same data (_data_token) for the same forward (the one step tensor the siblings' forwards
    shared: _shared_x_codes), source, config and blocking. The entry keeps its codes until the
    next call replaces it.

    A traced backward does not share them: an operator whose inputs are all forward values is
    placed in forward by AOT autograd's partitioner (it never recomputes opaque operators), and
    its codes would be kept, which recompute is there to avoid; each sibling's hot::layer_bwd
    forms them (the quantized forward's codes are still formed once, by hot::x_codes)."""
    args = (x2d, step, ctx.src, ctx.cfg, ctx.seq)
    token = _data_token(x2d, *args[2:])
    return _last_or(_LAST_BWD_CODES, token[0], (token[1], weakref.ref(step)),
                    lambda: _bwd_codes(*args))


def _layer_bwd_fake(gy2d, w2d, saved0, saved1, fwd_step, key, cfg_key, exact, seq, need_gx,
                    need_gw,
                    need_gb, in_features, x_dtype, w_dtype, recompute):
    n, o = gy2d.shape
    gx = gy2d.new_empty((n, in_features), dtype=_DTYPES[x_dtype]) if need_gx else _empty(gy2d)
    gw = (gy2d.new_empty((o, in_features), dtype=gw_dtype(gy2d, _DTYPES[w_dtype])) if need_gw
          else _empty(gy2d))
    gb = gy2d.new_empty((o,)) if need_gb else _empty(gy2d)
    return gx, gw, gb


layer_bwd = _def("layer_bwd(Tensor gy2d, Tensor? w2d, Tensor? saved0, Tensor? saved1, "
                 "Tensor? fwd_step, int key, "
                 "int cfg_key, bool exact, int seq, bool need_gx, bool need_gw, bool need_gb, "
                 "int in_features, str x_dtype, str w_dtype, bool recompute) "
                 "-> (Tensor, Tensor, Tensor)", _layer_bwd, _layer_bwd_fake,
                 # Inputs of any strides (the body reads strided g_y, as eager autograd may
                 # hand it): torch.compile's default for a custom operator, exact strides, makes
                 # inductor compute a g_y that reaches it as a view (qkv's: a reshape of the
                 # permuted stack of the attention gradients) into a buffer of the view's shape,
                 # indexed through 2-D offsets it cannot vectorize (2-byte loads: 124 against
                 # 76 us on ViT-B's qkv, H100). Without a constraint it computes the producer in
                 # its own layout, and the operator reads a view of that.
                 tags=(torch.Tag.flexible_layout,))


# ---------------------------------------------------------------- entry points of the layers


def _recompute(layer, x: torch.Tensor, w: torch.Tensor, seq: int,
               copy_rows: Optional[int]) -> bool:
    """Whether the ABC codes are formed in backward from a kept x (HLAConfig.abc): "recompute",
    or "auto" where keeping x is free: eagerly where x's producer keeps x anyway, under compile
    where the partitioner may rebuild what backward materializes (else it would save x itself,
    which the codes undercut).

    Under compile, an x that is the layer's own autocast copy of a tensor needing no gradient
    (``copy_rows`` = the rows its codes would have: an image at the patch embedding) is kept
    by nothing else, so the partitioner would keep it or its wider source: the smaller of x
    and its codes is kept."""
    h = layer.hot_config.hla
    if h.abc != "auto":
        return h.abc == "recompute"
    if torch.compiler.is_compiling():
        import torch._functorch.config as fc

        if fc.ban_recompute_materialized_backward:
            return False
        if copy_rows is not None and not x.requires_grad:
            cols = math.prod(w.shape[1:])
            return x.numel() * x.dtype.itemsize < _codes_nbytes(copy_rows, cols, seq, h, x)
        return True
    return kept_by_producer(x)


def _codes_nbytes(rows: int, cols: int, seq: int, h, x: torch.Tensor) -> int:
    """Bytes of the ABC codes and scales of a (rows, cols) input like x (the shapes of
    hot.common.ops.hla_fake after seq_pad), from the sizes alone: nothing enters a traced graph."""
    if seq > 0:
        rows = rows // seq * ops.pad_to(seq)
    code = ops.dtype_of_codes(h.bits, x)
    scales = cols if h.scale == "channel" else 1
    return cols * (ops.pad_to(rows) // ops.BLOCK * h.rank) * code.itemsize + scales * 4


def _flags(layer, x: torch.Tensor, w: torch.Tensor, seq: int,
           copy_rows: Optional[int]) -> CallFlags:
    """The constants of this call (CallFlags)."""
    cfg = layer._hot_run_config
    h = cfg.hla
    exact = layer._hot_exact_phase or x.numel() == 0 or is_narrow(layer, cfg)
    return CallFlags(layer._hot_config_key, x.requires_grad, w.requires_grad, exact, seq, h.rank,
                     h.bits or 0, h.scale == "channel", _recompute(layer, x, w, seq, copy_rows),
                     draws_rows(cfg), quantizes_forward(cfg, exact), offloads(cfg, exact, x))


def _gemm_bias(b: Optional[torch.Tensor], f: CallFlags) -> Optional[torch.Tensor]:
    """The bias as the operator takes it: widened to float32 (exactly) where the forward GEMM is
    quantized, whose epilogue adds a float32 bias (hot.nn.forward.coded_gemm). Widened here,
    outside the opaque operator, torch.compile fuses it with autocast's cast of the bias into
    one kernel, instead of the operator launching a conversion of its own in every layer; the
    bias gradient flows back through both casts, as nn.Linear's does under autocast."""
    if b is None or not f.qfwd or b.dtype == torch.float32:
        return b
    return b.to(torch.float32)


def linear(layer, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor],
           seq: int, origin: Optional[torch.Tensor] = None) -> torch.Tensor:
    """HOTLinear's forward (inputs validated and autocast-cast by the caller; ``origin``: the
    input autocast's cast made x from, where it made a copy)."""
    flags = _flags(layer, x, w, seq, math.prod(x.shape[:-1]) if origin is not None else None)
    b = _gemm_bias(b, flags)
    source = _codes_source(layer, flags)
    src = source._hot_key if source is not None else 0
    token = None  # eagerly, what names x's codes for sibling layers' calls (_shared_x_codes):
    if src and not torch.compiler.is_compiling():  # x's data and the source's step and config
        token = _data_token(x if origin is None else origin, x.dtype, source.hot_step_value(),
                            source._hot_config_key)
    if x.dim() == 2:  # no views around the Function: its output is the layer's output
        return LinearFn.apply(x, w, b, layer._hot_key, flags, src, token)[0]
    y2d = LinearFn.apply(x.reshape(-1, x.shape[-1]), w, b, layer._hot_key, flags, src,
                         token)[0]
    return y2d.reshape(*x.shape[:-1], y2d.shape[-1])


def conv2d(layer, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], geom,
           seq: int, x_cast: bool = False) -> torch.Tensor:
    """HOTConv2d's forward; geom = (stride, padding, dilation)."""
    stride, padding, dilation = (list(g) for g in geom)
    rows = None
    if x_cast:  # the patches' rows: one per output position
        ho, wo = conv_out_hw(x.shape, w.shape, stride, padding, dilation)
        rows = x.shape[0] * ho * wo
    flags = _flags(layer, x, w, seq, rows)
    return ConvFn.apply(x, w, _gemm_bias(b, flags), layer._hot_key, stride, padding, dilation,
                        flags)[0]
