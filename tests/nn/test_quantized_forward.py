"""HOTConfig(forward="int8"): the forward GEMM on 8-bit Hadamard-quantized operands.

The error bound (docs/algorithm.md §5b; the forward_error_bound fixture of tests/conftest.py).
With a = x H (one token's row) and c = W H (one output
channel's row), nearest rounding leaves |da_k| <= s_x / 2 and |dc_k| <= s_w / 2 (s = absmax /
127 of the row), so one output's error is
    |sum_k (a_k + da_k)(c_k + dc_k) - a_k c_k| <= s_x/2 ||c||_1 + s_w/2 ||a||_1 + I16 s_x s_w / 4,
plus the float32 rounding of the transforms and the epilogue (relative 1e-5 of sum |a_k c_k|
is far above it for these sizes). The tests assert that bound elementwise and that the error
is not zero (a forward left exact would pass the bound alone). The backward is the exact
product's: with the same seeds its gradients equal those of the exact forward bit for bit.
"""

from __future__ import annotations

import copy
import operator

import pytest
import torch
import torch.nn as nn

import hot


def _pair(module_fn, cfg_a, cfg_b, seed=0):
    """Two copies of one module, converted with cfg_a and cfg_b."""
    torch.manual_seed(seed)
    a = module_fn()
    b = copy.deepcopy(a)
    hot.convert(a, cfg_a, convert_head=True, backend="reference")
    hot.convert(b, cfg_b, convert_head=True, backend="reference")
    return a, b


@pytest.mark.parametrize("shape", [(40, 64, 48), (37, 21, 5), (16, 16, 16)])
def test_linear_output_within_the_rounding_bound(shape, forward_error_bound):
    tokens, cin, cout = shape
    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, cin, generator=g)
    x[::7] *= 20  # outlier tokens: per-token scales matter
    lin = nn.Linear(cin, cout)
    exact = lin(x).detach().double()
    lin = hot.convert(lin, hot.HOTConfig.quantized(), backend="reference")
    y = lin(x).detach().double()
    err = (y - exact).abs()
    assert (err <= forward_error_bound(x, lin.weight.detach())).all()
    assert err.max() > 0  # the forward is quantized


def test_conv_output_within_the_rounding_bound(forward_error_bound):
    g = torch.Generator().manual_seed(2)
    conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
    x = torch.randn(2, 3, 9, 9, generator=g)
    exact = conv(x).detach().double()
    rows = torch.nn.functional.unfold(x, 3, padding=1, stride=2).transpose(1, 2).reshape(-1, 27)
    conv = hot.convert(conv, hot.HOTConfig.quantized(), backend="reference")
    y = conv(x).detach()
    assert y.shape == exact.shape and y.is_contiguous()
    err = (y.double() - exact).permute(0, 2, 3, 1).reshape(-1, 8).abs()
    assert (err <= forward_error_bound(rows, conv.weight.detach().reshape(8, -1))).all()
    assert err.max() > 0


def _grads(model, x, gy):
    x = x.clone().requires_grad_(True)
    y = model(x)
    y.backward(gy)
    return [x.grad] + [p.grad for p in model.parameters()]


# HLA settings under which the forward cannot form ABC's codes in its own pass over x (padded
# sequences, a delayed history: the codes are formed as with the exact forward) or can.
HLA_CASES = {"save": {"abc": "save"}, "recompute": {"abc": "recompute"},
             "sequence": {"abc": "save", "blocking": "sequence"},
             "delayed": {"abc": "save", "amax": "delayed", "selection": "lowpass"}}


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("hla", list(HLA_CASES))
def test_backward_is_the_exact_forwards(kind, hla):
    """Straight-through: the same gradients as with the exact forward, for the same g_y and
    seeds, over two steps (also where the ABC codes come from the forward's pass over x)."""
    if kind == "linear":
        make = lambda: nn.Sequential(nn.Linear(48, 40))  # noqa: E731
        x, gy = torch.randn(2, 27, 48), torch.randn(2, 27, 40)  # 27 tokens: padded sequences
    else:
        make = lambda: nn.Sequential(nn.Conv2d(4, 8, 3, padding=1))  # noqa: E731
        x, gy = torch.randn(2, 4, 8, 8), torch.randn(2, 8, 8, 8)
    cfg = hot.HOTConfig(seed=5).replace(hla=HLA_CASES[hla])
    a, b = _pair(make, cfg, cfg.replace(forward="int8"))
    for _ in range(2):
        for ga, gb in zip(_grads(a, x, gy), _grads(b, x, gy)):
            assert torch.equal(ga, gb)
        for m in (a, b):
            m.zero_grad()


def test_frozen_weight_quantizes_the_forward_and_passes_g_x():
    """A frozen base layer (LoRA): no ABC codes, the forward still quantized, g_x HOT's."""
    torch.manual_seed(0)
    a, b = _pair(lambda: nn.Sequential(nn.Linear(32, 24)), hot.HOTConfig(seed=2),
                 hot.HOTConfig.quantized().replace(seed=2))
    for m in (a, b):
        m[0].weight.requires_grad_(False)
    x = torch.randn(40, 32)
    assert not torch.equal(a(x), b(x))
    ga, gb = _grads(a, x, torch.ones(40, 24)), _grads(b, x, torch.ones(40, 24))
    assert torch.equal(ga[0], gb[0]) and b[0].weight.grad is None


def test_exact_phases_and_narrow_layers_run_the_exact_forward():
    torch.manual_seed(0)
    lin, narrow = nn.Linear(32, 16), nn.Linear(8, 16)
    x, xn = torch.randn(20, 32), torch.randn(20, 8)
    y0, yn0 = lin(x).detach(), narrow(xn).detach()
    cfg = hot.HOTConfig.quantized().replace(exact_steps=1, min_in_features=16)
    lin, narrow = (hot.convert(m, cfg, backend="reference") for m in (lin, narrow))
    y = lin(x)
    assert torch.equal(y.detach(), y0)  # step 0 is exact
    y.sum().backward()
    assert not torch.equal(lin(x).detach(), y0)  # step 1 is quantized
    for _ in range(2):
        yn = narrow(xn)
        assert torch.equal(yn.detach(), yn0)
        yn.sum().backward()


def test_compiled_equals_eager():
    torch.manual_seed(0)
    make = lambda: nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16))  # noqa: E731
    cfg = hot.HOTConfig.quantized().replace(seed=3)
    a, b = _pair(make, cfg, cfg)
    x = torch.randn(24, 32)
    cb = torch.compile(b, backend="aot_eager", fullgraph=True)
    ya, yb = a(x), cb(x)
    assert torch.equal(ya, yb)
    ga, gb = _grads(a, x, torch.ones_like(ya)), _grads(cb, x, torch.ones_like(yb))
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


def test_forward_value_is_validated():
    with pytest.raises(hot.HOTConfigError, match="forward"):
        hot.HOTConfig(forward="fp4")
    assert hot.HOTConfig.quantized().forward == "int8"
    assert hot.HOTConfig().forward == "exact" and hot.HOTConfig.paper().forward == "exact"


def test_inference_runs_the_exact_forward():
    """Only training steps quantize the forward: under torch.no_grad the layer is nn.Linear."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 16)
    x = torch.randn(20, 32)
    ref = lin(x).detach()
    lin = hot.convert(lin, hot.HOTConfig.quantized(), backend="reference")
    with torch.no_grad():
        assert torch.equal(lin(x), ref)
    assert not torch.equal(lin(x).detach(), ref)


def _make(kind):
    """A converted-to-be layer followed by GELU, and an input for it."""
    if kind == "linear":
        return (lambda: nn.Sequential(nn.Linear(32, 48), nn.GELU())), torch.randn(24, 32)
    return (lambda: nn.Sequential(nn.Conv2d(16, 32, 3), nn.GELU())), torch.randn(2, 16, 6, 6)


def _traced(kind, autocast: bool):
    """(a, cb, x, ya, yb, call): eager (a) and compiled (cb) copies of _make(kind) with the
    quantized forward, their outputs on x (under bfloat16 autocast or not) and the node of the
    layer's operator (hot::linear_fwd / hot::conv_fwd) in the traced graph."""
    from hot.nn import autograd as ag

    torch._dynamo.reset()  # a fresh recompile budget: earlier tests of the process compiled too
    torch.manual_seed(0)
    make, x = _make(kind)
    cfg = hot.HOTConfig.quantized().replace(seed=3)
    a, b = _pair(make, cfg, cfg)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    cb = torch.compile(b, backend=capture, fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ya, yb = a(x), cb(x)
    op = ag.linear_fwd if kind == "linear" else ag.conv_fwd
    # the Function's forward is a subgraph of dynamo's graph (autograd_function_apply)
    calls = [n for g in graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule)
             for n in m.graph.nodes if n.target in (op, op.overloadpacket)]
    assert len(calls) == 1
    return a, cb, x, ya, yb, calls[0]


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_bias_goes_into_the_operator(kind):
    """With a quantized forward the bias is an argument of hot::linear_fwd / hot::conv_fwd (the
    GEMM's epilogue adds it) and the operator's y is the Function's output: nothing is added
    after it in the traced graph. Compiled equals eager, outputs and gradients."""
    a, cb, x, ya, yb, call = _traced(kind, autocast=False)
    assert torch.equal(ya, yb)
    bias = call.args[2]
    assert isinstance(bias, torch.fx.Node) and bias.op == "placeholder" and "bias" in bias.name
    y_nodes = [u for u in call.users if u.target is operator.getitem and u.args[1] == 0]
    assert len(y_nodes) == 1
    # From the operator's y to the Function's output: nothing but (for a conv, whose operator
    # gives the GEMM's rows) the layout change to (B, O, Ho, Wo); no add of a bias.
    node, layout = y_nodes[0], {"reshape", "view", "permute", "contiguous"}
    if kind == "conv":  # the operator's y: the GEMM's (B Ho Wo, O) rows, laid out by ConvFn
        assert tuple(node.meta["example_value"].shape) == (2 * 4 * 4, 32)
    while [u.op for u in node.users] != ["output"]:
        (node,) = node.users
        assert kind == "conv" and node.op == "call_method" and node.target in layout, node
    if kind == "conv":  # as F.conv2d lays out its output
        assert ya.shape == (2, 32, 4, 4) and ya.is_contiguous() and yb.is_contiguous()
    ga, gb = _grads(a, x, torch.ones_like(ya)), _grads(cb, x, torch.ones_like(yb))
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_autocast_bias_reaches_the_operator_as_float32(kind):
    """Under bfloat16 autocast with a quantized forward the operator takes the bias as float32
    (autocast's bfloat16 bias, widened outside the opaque operator so torch.compile fuses both
    casts into one kernel): in the traced graph hot::linear_fwd / hot::conv_fwd's bias is a
    float32 value computed from the parameter, not the parameter. Compiled equals eager, and the
    bias gradient is autocast nn.Linear's: the column sums of g_y rounded to bfloat16, then
    widened to the parameter's float32 (so every entry is a bfloat16 value)."""
    a, cb, x, ya, yb, call = _traced(kind, autocast=True)
    assert ya.dtype == torch.bfloat16 and torch.equal(ya, yb)
    assert call.args[2].meta["example_value"].dtype == torch.float32
    g = torch.randn_like(ya)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ga = _grads(a, x, g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        gb = _grads(cb, x, g)
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=0, atol=0)
    gbias = a[0].bias.grad
    assert gbias.dtype == torch.float32
    assert torch.equal(gbias, gbias.to(torch.bfloat16).float())  # autocast's bf16 rounding
    assert gbias.abs().sum() > 0

def _layer_product(kind, layer, x):
    """The quantized forward's float32 product before the bias, from its operations (per-token
    and per-output-channel HQ codes, round to nearest, then the reference GEMM), (N, O, Ho, Wo)
    for a conv: y = cvt(product + float32(bias))."""
    from hot.common import ops
    from hot.nn.forward import forward_args
    from hot.reference import ops as ref

    w = layer.weight.detach()
    if kind == "linear":
        rows = x
    else:  # F.unfold's rows (b, oh, ow) and columns (c, i, j)
        rows = torch.nn.functional.unfold(x, w.shape[-2:]).transpose(1, 2).reshape(-1, w[0].numel())
    a = forward_args("int8")
    qx = ops.hq_quantize(rows, a, "reference")
    qw = ops.hq_quantize(w.reshape(w.shape[0], -1), a, "reference")
    p = ref.int_gemm_nt(qx.q, qw.q, qx.scale, qw.scale, torch.float32)
    if kind == "conv":
        ho, wo = x.shape[2] - w.shape[2] + 1, x.shape[3] - w.shape[3] + 1
        p = p.reshape(x.shape[0], ho, wo, -1).permute(0, 3, 1, 2)
    return p


@pytest.mark.parametrize("kind", ["linear", "conv"])
def test_quantized_output_adds_the_bias_before_the_one_rounding(kind):
    """Under bfloat16 autocast (CPU, the reference backend): y = bf16(P + b_d), P the float32
    product of the codes (scaled) and b_d the bias as autocast casts it (to bfloat16, as for
    nn.Linear), i.e. the bias added in the GEMM's epilogue, in float32, before the single
    rounding of y. Bit for bit, and different somewhere from adding the bias after rounding y
    (old = bf16(bf16(P) + b_d), the order of an add after the operator), so a return to that
    order fails."""
    torch.manual_seed(0)
    make, x = _make(kind)
    x = x * 3
    layer = hot.convert(make(), hot.HOTConfig.quantized().replace(seed=3), convert_head=True,
                        backend="reference")[0]
    with torch.no_grad():  # make the bias as large as the products: its rounding order shows
        layer.bias.normal_(0, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16
    y = y.detach().float()
    p = _layer_product(kind, layer, x.to(torch.bfloat16))
    shape = (-1,) + (1,) * (p.dim() - 2)  # the bias per output channel (dimension 1)
    b_d = layer.bias.detach().to(torch.bfloat16).reshape(shape)
    assert torch.equal(y, (p + b_d.float()).to(torch.bfloat16).float())
    old = (p.to(torch.bfloat16) + b_d).float()
    assert (y != old).any()  # the order shows in these outputs


def test_float32_quantized_output_is_unchanged_by_the_bias_order():
    """In float32 the bias added before the rounding into y's dtype and after it are the same
    operation, rn32(P + b): the layer's output is P + b, one float32 addition."""
    torch.manual_seed(0)
    make, x = _make("linear")
    layer = hot.convert(make(), hot.HOTConfig.quantized().replace(seed=3), convert_head=True,
                        backend="reference")[0]
    y = layer(x).detach()
    p = _layer_product("linear", layer, x)
    assert torch.equal(y, p + layer.bias.detach())
