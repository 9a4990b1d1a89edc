"""What happens on misuse, as docs/api.md says: set_config between a forward and its backward,
higher-order and functional autograd, meta-device init loaded with assign=True, and converting a
bare layer without using the return value."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot

_SWITCHES = [(hot.HOTConfig.lbp_wht(), hot.HOTConfig()), (hot.HOTConfig(), hot.HOTConfig.int4()),
             (hot.HOTConfig.int4(), hot.HOTConfig()), (hot.HOTConfig(), hot.HOTConfig.exact()),
             (hot.HOTConfig(), hot.HOTConfig().replace(hla={"rank": 4}))]


@pytest.mark.parametrize("conv", [False, True])
@pytest.mark.parametrize("before,after", _SWITCHES, ids=lambda c: c.method + str(c.hla.rank))
def test_set_config_between_forward_and_backward_applies_from_the_next_forward(before, after,
                                                                               conv):
    """The backward runs with its forward's config: the same gradients as without the switch,
    and the next forward takes the new config."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3) if conv else nn.Linear(24, 8))
    x = torch.randn(4, 3, 5, 5) if conv else torch.randn(20, 24)

    def grads(switch: bool):
        model = hot.convert(copy.deepcopy(plain), before, backend="reference")
        y = model(x.clone().requires_grad_())
        if switch:
            assert hot.set_config(model, after) == 1
        y.square().sum().backward()
        return [p.grad for p in model.parameters()], model

    want, _ = grads(False)
    got, model = grads(True)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert model[0].hot_config == after
    model(x.clone().requires_grad_()).sum().backward()  # the new config's own forward


def test_converting_a_bare_layer_without_using_the_return_value_converts_it():
    """hot.convert(layer) on a bare layer makes that layer a HOT layer (not a copy the caller
    may drop); unconvert turns it back, also in place."""
    torch.manual_seed(0)
    lin = nn.Linear(32, 16)
    w = lin.weight
    out = hot.convert(lin, backend="reference")
    assert out is lin and isinstance(lin, hot.HOTLinear) and lin.weight is w
    x = torch.randn(32, 32)
    lin(x).square().sum().backward()
    exact = x.t() @ (2 * nn.functional.linear(x, w, lin.bias)).detach()
    assert lin.hot_step_value() == 1 and not torch.allclose(w.grad, exact.t())  # quantized
    assert hot.unconvert(lin) is lin and type(lin) is nn.Linear
    assert list(lin.buffers()) == [] and [k for k in vars(lin) if "hot" in k] == []
    lin(x)  # a plain layer again


def _net(cfg=None):
    torch.manual_seed(0)
    return hot.convert(nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1)), cfg,
                       backend="reference")


@pytest.mark.parametrize("allow_unused", [False, True])
def test_hessian_vector_product_raises_naming_hot(allow_unused):
    """create_graph=True through a HOT layer raises at once: with allow_unused=True PyTorch alone
    would return None for every parameter, silently."""
    net = _net(hot.HOTConfig.exact())
    params = list(net.parameters())
    with pytest.raises(RuntimeError, match="HOT layer '2': a higher-order gradient.*unconvert"):
        g = torch.autograd.grad(net(torch.randn(5, 8)).sum(), params, create_graph=True)
        torch.autograd.grad(sum(t.sum() for t in g), params, allow_unused=allow_unused)


def test_torch_func_transforms_raise_naming_hot_and_inference_under_vmap_works():
    net = _net()
    x = torch.randn(5, 1, 8)
    with pytest.raises(hot.HOTLayerError, match="HOT layer '0': torch.func transforms"):
        torch.vmap(net)(x)
    params = dict(net.named_parameters())
    with pytest.raises(hot.HOTLayerError, match="torch.func transforms"):
        torch.func.grad(lambda p: torch.func.functional_call(net, p, (x,)).sum())(params)
    with torch.no_grad():
        torch.testing.assert_close(torch.vmap(net)(x), net(x))


@pytest.mark.parametrize("hot_state", [False, True])
def test_meta_init_then_load_with_assign_trains(hot_state):
    """A model built on the meta device and loaded with assign=True (from a HOT checkpoint or a
    plain one) trains like the model it was loaded from."""
    src = _net()
    with torch.device("meta"):
        dst = hot.convert(nn.Sequential(nn.Linear(8, 4), nn.Tanh(), nn.Linear(4, 1)),
                          backend="reference")
    sd = src.state_dict() if hot_state else hot.plain_state_dict(src)
    # copies, as from a file: assign=True would share src's step counter with dst
    dst.load_state_dict({k: v.clone() for k, v in sd.items()}, assign=True)
    for _, m in hot.hot_layers(dst):
        assert m.hot_step.device.type == "cpu" and m.hot_lqs.device.type == "cpu"
    x = torch.randn(20, 8)
    for net in (src, dst):
        net(x).square().sum().backward()
    for a, b in zip(src.parameters(), dst.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert [int(m.hot_step) for _, m in hot.hot_layers(dst)] == [1, 1]
