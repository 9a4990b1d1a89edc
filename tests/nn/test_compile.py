"""HOT layers inside torch.compile: no graph break, and the same training as eager mode.

The compile path runs the same per-layer state machine (step counter, seeds, LQS, ABC) inside
opaque custom ops (hot.nn.autograd), so with the same HOTConfig(seed=...) and the same batches
a compiled HOT model must produce bit-identical gradients to the eager HOT model: the custom ops
run the very same reference kernels on the very same inputs, and aot_eager runs the ATen ops
between them unchanged. Any difference in the plan (wrong step, seed, phase, LQS choice, a
forward op replayed in backward) changes stochastic-rounding codes and shows up as a gradient
difference of the order of a quantization step, far above float rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config
import torch.nn as nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import hot
from hot.models.vit import TinyViT
from hot.nn.modules import HOTLinear

@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.LayerNorm(48), nn.Linear(48, 16))


def _train(model, fwd, batches, x_grad=False, autocast=False):
    """SGD steps of fwd on (x, target) batches: [(loss, x.grad, {name: grad})] per step."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for x, t in batches:
        x = x.clone().requires_grad_(x_grad)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = fwd(x)
        loss = (y.float() - t).square().mean()
        loss.backward()
        out.append((loss.detach(), x.grad,
                    {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out


def _batches(shape, out_dim, n=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(shape, generator=g), torch.randn(*shape[:-1], out_dim, generator=g))
            for _ in range(n)]


def _assert_same_training(eager, comp):
    assert len(eager) == len(comp)
    for step, ((le, gxe, ge), (lc, gxc, gc)) in enumerate(zip(eager, comp)):
        assert torch.equal(le, lc), f"step {step}: loss {le} vs {lc}"
        if gxe is not None:
            assert torch.equal(gxe, gxc), f"step {step}: input gradient differs"
        for n in ge:
            assert torch.equal(ge[n], gc[n]), (
                f"step {step}: grad of {n} differs by {(ge[n] - gc[n]).abs().max()}")


def _steps(model):
    return [int(m.hot_step) for _, m in hot.hot_layers(model)]


def _names(model):
    return [n for n, _ in hot.hot_layers(model)]


def test_mlp_compiles_without_graph_breaks_and_trains_like_eager():
    cfg = hot.HOTConfig(seed=7)
    base = _mlp()
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    batches = _batches((4, 8, 32), 16)
    eager = _train(me, me, batches, x_grad=True)
    # fullgraph=True raises at the first graph break; the counter double-checks.
    comp = _train(mc, torch.compile(mc, backend="aot_eager", fullgraph=True), batches, x_grad=True)
    assert sum(counters["graph_break"].values()) == 0
    _assert_same_training(eager, comp)
    # One backward per step advances each layer's counter by one, in both modes.
    assert _steps(mc) == _steps(me) == [3, 3]
    # The LQS state machine ran inside the ops as in eager mode.
    assert [m.hot_lqs_value() for _, m in hot.hot_layers(mc)] == \
           [m.hot_lqs_value() for _, m in hot.hot_layers(me)]


def _compiled_like_eager_frames(cfg) -> int:
    """Train an MLP 4 steps eagerly and compiled under ``cfg``; assert the same training and
    4 steps counted per layer; return the compiled frames."""
    base = _mlp()
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    batches = _batches((2, 16, 32), 16, n=4)
    eager = _train(me, me, batches)
    cnt = CompileCounterWithBackend("aot_eager")
    comp = _train(mc, torch.compile(mc, backend=cnt, fullgraph=True), batches)
    _assert_same_training(eager, comp)
    assert _steps(mc) == [4, 4]
    return cnt.frame_count


def test_phases_recompile_once_not_per_step():
    """exact_steps=1: step 0 saves x (exact), later steps save the ABC codes: one recompile at the
    phase change, none for the step counter or seeds; int8_steps changes no shape: no recompile."""
    assert _compiled_like_eager_frames(hot.HOTConfig(seed=11, exact_steps=1, int8_steps=1)) == 2


def test_exact_cool_down_recompiles_once():
    """exact_from=2: steps 0-1 HOT, 2-3 exact; compiled training equals eager, with one
    recompile where the phase flips."""
    assert _compiled_like_eager_frames(hot.HOTConfig(seed=3, exact_from=2)) == 2


def test_tiny_vit_sequence_blocking_and_global_rng_seeds():
    """TinyViT (attention, GELU, LayerNorm, CLS slicing) with blocking='sequence' and seed=None:
    the seed bases come from torch.initial_seed() (the last torch.manual_seed), read at run time
    inside the ops, so the compiled model must round as the eager one. Both convert the head
    too (the paper's setting), and both must hold the same HOT layers: a model whose head stays
    exact trains differently from one whose head is HOT, compiled or not."""
    cfg = hot.HOTConfig(hla=hot.HLAConfig(blocking="sequence"))
    torch.manual_seed(0)
    base = TinyViT(image_size=8, channels=1, classes=4, patch=4, dim=32, depth=1, heads=2, mlp=32)
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference", convert_head=True)
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference", convert_head=True)
    assert _names(mc) == _names(me) and "head" in _names(mc) and len(_names(mc)) == 6
    batches = _batches((3, 1, 8, 8), 4)
    batches = [(x, t[:, 0, 0, :]) for x, t in batches]  # targets (B, classes)
    fwd = torch.compile(mc, backend="aot_eager", fullgraph=True)
    torch.manual_seed(5)
    eager = _train(me, me, batches)
    torch.manual_seed(5)
    comp = _train(mc, fwd, batches)
    _assert_same_training(eager, comp)
    assert _steps(mc) == _steps(me) == [3] * 6


def test_conv_compiles_without_graph_breaks_and_trains_like_eager():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, stride=2, bias=False), nn.Flatten(),
                         nn.Linear(16 * 3 * 3, 5))
    cfg = hot.HOTConfig(seed=2, exact_steps=1)
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    batches = _batches((2, 3, 8, 8), 1)
    batches = [(x, t[:, 0, 0, :1].expand(2, 5).contiguous()) for x, t in batches]
    eager = _train(me, me, batches, x_grad=True)
    comp = _train(mc, torch.compile(mc, backend="aot_eager", fullgraph=True), batches, x_grad=True)
    _assert_same_training(eager, comp)
    assert _steps(mc) == [3, 3, 3]


def test_channels_last_pointwise_conv_in_its_exact_phase_compiles():
    """A 1x1 convolution's patches of a channels-last x are a view of x; kept in the exact
    phase, hot::conv_fwd returns a copy, as a custom operator's output may not alias its input
    (an error under torch.compile in this suite: tests/conftest.py)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU(), nn.Conv2d(8, 4, 1), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 5)).to(memory_format=torch.channels_last)
    cfg = hot.HOTConfig(seed=2, exact_steps=2)
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    batches = [(x.to(memory_format=torch.channels_last), t[:, 0, 0, :1].expand(2, 5).contiguous())
               for x, t in _batches((2, 8, 4, 4), 1)]
    eager = _train(me, me, batches, x_grad=True)
    comp = _train(mc, torch.compile(mc, backend="aot_eager", fullgraph=True), batches, x_grad=True)
    _assert_same_training(eager, comp)


def test_autocast_bf16_compiles_without_graph_breaks():
    """Autocast is applied before the ops as in eager mode (bf16 codes of bf16 operands)."""
    cfg = hot.HOTConfig(seed=4)
    base = _mlp()
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    batches = _batches((4, 4, 32), 16, n=2)
    eager = _train(me, me, batches, autocast=True)
    comp = _train(mc, torch.compile(mc, backend="aot_eager", fullgraph=True), batches,
                  autocast=True)
    _assert_same_training(eager, comp)


def test_inductor_matches_eager():
    """Inductor generates its own kernels for the ops between HOT layers. With only ReLU (exact
    select), reshapes and the loss' 2*y between them, the custom ops see bit-identical inputs,
    so the gradients are bit-identical (the bias gradient is summed inside hot::layer_bwd, in
    eager mode's order)."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))
    cfg = hot.HOTConfig(seed=9)
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    x = torch.randn(16, 32)
    _assert_inductor_grads_equal(me, mc, lambda f: f(x).square().sum())
    assert _steps(mc) == [2, 2]


def _assert_inductor_grads_equal(me, mc, loss):
    """Two steps of ``loss(model)`` eagerly on ``me`` and compiled by inductor on ``mc`` (a copy
    converted alike) give bit-identical parameter gradients."""

    def run(m, f):
        res = []
        for _ in range(2):
            m.zero_grad(set_to_none=True)
            loss(f).backward()
            res.append({n: p.grad.clone() for n, p in m.named_parameters()})
        return res

    # On-disk caches are keyed on the forward graph, not on the ops' Python bodies: a cached
    # backward could run code older than the source under test. (The backward compiles at the
    # first backward call, so the whole run stays inside the patches.)
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        outs = [run(me, me), run(mc, torch.compile(mc, backend="inductor", fullgraph=True))]
    for ge, gc in zip(*outs):
        for n in ge:
            assert torch.equal(ge[n], gc[n]), n



class _QKV(nn.Module):
    """A qkv projection whose g_y reaches hot::layer_bwd as a view of a permuted stack (of the
    three heads' gradients), or, with ``transposed``, a loss whose g_y is a transposed tensor."""

    def __init__(self, transposed: bool):
        super().__init__()
        self.qkv, self.transposed = nn.Linear(32, 96), transposed

    def forward(self, x, c):
        y = self.qkv(x)
        if self.transposed:
            return (y.transpose(-1, -2) * c.flatten()[:96].reshape(1, 96, 1)).sum()
        q, k, v = y.reshape(x.shape[0], x.shape[1], 3, 2, 16).permute(2, 0, 3, 1, 4).unbind(0)
        return (q * c[0]).sum() + (k * c[1]).sum() + (v * c[2]).sum()


@pytest.mark.parametrize("transposed", [False, True])
def test_layer_bwd_takes_g_y_as_the_graph_lays_it_out(transposed):
    """hot::layer_bwd carries torch.Tag.flexible_layout: inductor passes g_y as the graph computes
    it (a view of a permuted stack, a transposed gradient) instead of first copying it into a
    buffer of the 2-D view's shape, which it indexes through offsets it does not vectorize
    (docs/architecture.md). The body reads any strides: with only layout ops and products by
    constants between the layer and the loss, g_y is the same numbers in both modes, so the
    gradients are bit-identical to eager's."""
    assert torch.Tag.flexible_layout in torch.ops.hot.layer_bwd.default.tags
    torch.manual_seed(0)
    base = _QKV(transposed)
    cfg = hot.HOTConfig(seed=9)
    me = hot.convert(copy.deepcopy(base), cfg, convert_head=True, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, convert_head=True, backend="reference")
    x, c = torch.randn(4, 16, 32), torch.randn(3, 4, 2, 16, 16)
    _assert_inductor_grads_equal(me, mc, lambda f: f(x, c))

def test_bias_only_layer_still_counts_its_backward():
    """A frozen weight and an input without grad: only g_b is needed. Eager mode still counts the
    backward; the compiled op must not be dead-code eliminated (its g_b output is used)."""
    cfg = hot.HOTConfig(seed=3)
    base = _mlp()
    me = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    mc = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    for m in (me, mc):
        m[0].weight.requires_grad_(False)
    batches = _batches((4, 8, 32), 16, n=2)
    eager = _train(me, me, batches)
    comp = _train(mc, torch.compile(mc, backend="aot_eager", fullgraph=True), batches)
    _assert_same_training(eager, comp)
    assert _steps(mc) == _steps(me) == [2, 2]


def test_deepcopy_gets_its_own_key():
    cfg = hot.HOTConfig(seed=1)
    m = hot.convert(nn.Sequential(nn.Linear(16, 16)), cfg, backend="reference")
    c = copy.deepcopy(m)
    assert c[0]._hot_key != m[0]._hot_key
    f = torch.compile(c, backend="aot_eager", fullgraph=True)
    f(torch.randn(16, 16)).sum().backward()
    assert _steps(c) == [1] and _steps(m) == [0]


def test_stale_graph_constants_raise_naming_the_layer():
    """The ops check the constants a graph was traced for against the layer's live state."""
    layer = hot.convert(nn.Sequential(nn.Linear(16, 8)),
                        hot.HOTConfig(seed=1).replace(hla={"abc": "save"}), backend="reference")[0]
    layer.hot_name = "enc.fc"
    assert isinstance(layer, HOTLinear)
    x = torch.randn(16, 16)
    with pytest.raises(RuntimeError, match="enc.fc"):
        # exact=True while the layer is past exact_steps (0): a stale graph.
        torch.ops.hot.linear_fwd(x, layer.weight, layer.bias, layer._hot_key, False, True,
                                 True, 0, 8, 8, True, False, True, False, False)
    with pytest.raises(RuntimeError, match="ABC recompute"):
        # traced for recomputing the ABC codes while the layer saves them
        torch.ops.hot.linear_fwd(x, layer.weight, layer.bias, layer._hot_key, False, True,
                                 False, 0, 8, 8, True, True, True, False, False)
    with pytest.raises(RuntimeError, match="quantized forward"):
        # traced for a quantized forward while the layer's config has an exact one
        torch.ops.hot.linear_fwd(x, layer.weight, layer.bias, layer._hot_key, False, True,
                                 False, 0, 8, 8, True, False, True, True, False)
    with pytest.raises(RuntimeError, match="ABC offload"):
        # traced for keeping the codes in host memory while the layer keeps them on its device
        torch.ops.hot.linear_fwd(x, layer.weight, layer.bias, layer._hot_key, False, True,
                                 False, 0, 8, 8, True, False, True, False, True)


def test_ops_are_allowed_in_cuda_graphs():
    """The operators' seeds follow the step counter in device memory, so inductor may capture
    them in CUDA graphs (mode="reduce-overhead"); its check for nodes it must not capture flags
    none of them (and does flag an operator tagged cudagraph_unsafe, so it is not vacuous)."""
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    lib = torch.library.Library("hot_test", "FRAGMENT")
    lib.define("unsafe(Tensor x) -> Tensor", tags=(torch.Tag.cudagraph_unsafe,))

    def flagged(target) -> bool:
        g = torch.fx.Graph()
        g.output(g.call_function(target, ()))
        return get_first_incompatible_cudagraph_node(torch.fx.GraphModule(nn.Module(), g)) \
            is not None

    assert flagged(torch.ops.hot_test.unsafe.default)
    for op in (torch.ops.hot.linear_fwd, torch.ops.hot.conv_fwd, torch.ops.hot.layer_bwd):
        assert not flagged(op.default), op
