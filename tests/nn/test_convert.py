"""convert / unconvert / set_config / hot_layers on small composite models."""

import warnings

import pytest
import torch
import torch.nn as nn

import hot
from hot import HOTConv2d, HOTLinear


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)  # depthwise: stays standard
        self.grouped = nn.Conv2d(8, 8, 1, groups=2)  # grouped: stays standard
        self.enc = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 4, bias=False)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        x = self.grouped(self.dw(self.stem(x)))
        x = x.mean((2, 3))
        return self.head(self.norm(self.enc(x)))


def _net():
    torch.manual_seed(0)
    return Net()


def _convert(model, **kw):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        hot.convert(model, backend="reference", **kw)
    return [str(x.message) for x in w]


def test_convert_replaces_types_and_keeps_parameter_objects():
    model = _net()
    params = dict(model.named_parameters())
    ids = {n: id(p) for n, p in params.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before conversion
    _convert(model)
    assert type(model.stem) is HOTConv2d
    assert type(model.enc[0]) is HOTLinear and type(model.enc[2]) is HOTLinear
    assert type(model.head) is HOTLinear
    assert type(model.dw) is nn.Conv2d and type(model.grouped) is nn.Conv2d
    assert type(model.norm) is nn.LayerNorm
    assert {n: id(p) for n, p in model.named_parameters()} == ids
    assert sorted(n for n, _ in hot.hot_layers(model)) == ["enc.0", "enc.2", "head", "stem"]
    assert model.enc[0].hot_name == "enc.0"
    # The optimizer built earlier updates the converted layers' weights.
    before = model.head.weight.detach().clone()
    model(torch.randn(2, 3, 5, 5)).sum().backward()
    opt.step()
    assert not torch.equal(model.head.weight, before)


def test_grouped_and_depthwise_convs_are_reported_once_per_kind_and_stay_standard(caplog):
    with caplog.at_level("INFO", logger="hot"):
        msgs = _convert(_net())
    assert msgs == []  # expected skips are logged, not warned per layer
    lines = [r.getMessage() for r in caplog.records]
    assert any("converted 1 Conv2d, 3 Linear" in m for m in lines), lines
    assert any("groups=8" in m and "'dw'" in m for m in lines), lines
    assert any("groups=2" in m and "'grouped'" in m for m in lines), lines


def test_filter_receives_fqn_and_module():
    seen = []

    def only_enc(fqn, mod):
        seen.append((fqn, type(mod)))
        return fqn.startswith("enc.")

    model = _net()
    msgs = _convert(model, filter=only_enc)
    assert sorted(n for n, _ in hot.hot_layers(model)) == ["enc.0", "enc.2"]
    assert type(model.stem) is nn.Conv2d and type(model.head) is nn.Linear
    assert ("head", nn.Linear) in seen and ("stem", nn.Conv2d) in seen
    assert msgs == []  # convs the filter excludes are not warned about


def test_convert_twice_gives_the_new_config_and_set_config_reaches_every_layer():
    model = _net()
    _convert(model)
    layers = dict(hot.hot_layers(model))
    model(torch.randn(2, 3, 5, 5)).sum().backward()
    _convert(model, config=hot.HOTConfig.exact())
    assert dict(hot.hot_layers(model)) == layers  # the same layer objects, state kept
    assert all(m.hot_config == hot.HOTConfig.exact() for m in layers.values())
    assert all(m.hot_step_value() == 1 for m in layers.values())
    assert hot.set_config(model, hot.HOTConfig()) == 4
    assert all(m.hot_config == hot.HOTConfig() for m in layers.values())


def test_unconvert_round_trip():
    model = _net()
    ids = {n: id(p) for n, p in model.named_parameters()}
    keys = set(model.state_dict())
    _convert(model)
    model(torch.randn(2, 3, 5, 5)).sum().backward()
    assert {k for k in model.state_dict() if "hot_" in k} == {
        f"{n}.{b}" for n in ("stem", "enc.0", "enc.2", "head") for b in ("hot_step", "hot_lqs")}
    hot.unconvert(model)
    for name in ("stem", "enc.0", "enc.2", "head"):
        mod = model.get_submodule(name)
        assert type(mod) in (nn.Linear, nn.Conv2d)
        assert not [b for b, _ in mod.named_buffers() if b.startswith("hot_")]
    assert set(model.state_dict()) == keys
    assert {n: id(p) for n, p in model.named_parameters()} == ids
    assert hot.hot_layers(model) == []
    # A plain layer again: its backward is autograd's.
    x = torch.randn(2, 8)
    model.head.weight.grad = None
    model.head(x).sum().backward()
    torch.testing.assert_close(model.head.weight.grad, x.sum(0, keepdim=True).expand(4, 8),
                               rtol=0, atol=0)


def test_unconvert_a_bare_layer():
    lin = hot.HOTLinear.from_linear(nn.Linear(3, 2), hot.HOTConfig(), "x")
    plain = hot.unconvert(lin)
    assert type(plain) is nn.Linear and plain.weight is lin.weight
    assert list(plain.buffers()) == []
    assert [k for k in vars(plain) if "hot" in k] == []  # no HOT state left behind


def test_plain_state_dict_loads_into_converted_model():
    src = _net()
    dst = Net()
    _convert(dst)
    dst.load_state_dict(src.state_dict())  # strict: the hot_* buffers are not required
    for name, value in src.state_dict().items():
        assert torch.equal(dst.state_dict()[name], value), name
    assert int(dst.head.hot_lqs) == -1 and int(dst.head.hot_step) == 0
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        assert torch.equal(dst(x), src(x))  # identical forward


def test_converted_forward_is_unchanged():
    model = _net()
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    y_ref = model(x)
    _convert(model)
    assert torch.equal(model(x), y_ref)


def test_convert_rejects_a_non_config():
    with pytest.raises(TypeError, match="HOTConfig"):
        hot.convert(_net(), {"hq": {"bits": 4}})
