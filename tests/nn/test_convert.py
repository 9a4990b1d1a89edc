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
    _convert(model, convert_head=True)
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
    assert any("converted 1 Conv2d, 2 Linear" in m for m in lines), lines
    assert any("output head" in m and "'head'" in m for m in lines), lines
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
    _convert(model, convert_head=True)
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
    _convert(model, convert_head=True)
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
    _convert(dst, convert_head=True)
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


def test_output_head_is_left_exact_by_default_and_converts_when_asked():
    model = _net()
    assert _convert(model) == []
    assert type(model.head) is nn.Linear and type(model.enc[2]) is HOTLinear
    s = hot.summary(model)
    assert s.left["output head"] == ("head",)
    assert set(s.converted) == {"stem", "enc.0", "enc.2"}
    _convert(model, convert_head=True)
    assert type(model.head) is HOTLinear
    assert "output head" not in hot.summary(model).left


class _Cls(nn.Module):
    """RoBERTa's classification head: two Linear layers under ``classifier``."""

    def __init__(self):
        super().__init__()
        self.dense, self.out_proj = nn.Linear(8, 8), nn.Linear(8, 2)


def test_output_head_rule_by_name_and_position():
    from hot.nn.selection import output_head

    # The last Linear without a head name: no head (an nn.Sequential converts entirely).
    assert output_head(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))) is None
    enc = nn.Module()
    enc.layer = nn.Module()
    enc.layer.output = nn.Module()  # HF BERT names a block's part "output": not a head
    enc.layer.output.dense = nn.Linear(4, 4)
    assert output_head(enc) is None
    tt = nn.Module()  # torchtune's Llama: the layer itself is named "output"
    tt.proj, tt.output = nn.Linear(4, 4), nn.Linear(4, 10)
    assert output_head(tt) == "output"
    rob = nn.Module()
    rob.encoder, rob.classifier = nn.Linear(8, 8), _Cls()
    assert output_head(rob) == "classifier"
    # A head name that is not the last Linear: the model's head is elsewhere.
    late = nn.Module()
    late.fc, late.proj = nn.Linear(4, 4), nn.Linear(4, 4)
    assert output_head(late) is None
    hot.convert(rob, backend="reference")
    assert type(rob.encoder) is HOTLinear
    assert type(rob.classifier.dense) is nn.Linear and type(rob.classifier.out_proj) is nn.Linear
    assert hot.summary(rob).left["output head"] == ("classifier.dense", "classifier.out_proj")


def test_module_filter_fn_is_called_module_first_and_excludes_with_a_reason():
    seen = []

    def no_convs(module, fqn):
        seen.append((type(module), fqn))
        return not isinstance(module, nn.Conv2d)

    model = _net()
    _convert(model, module_filter_fn=no_convs)
    assert (nn.Conv2d, "stem") in seen
    assert sorted(n for n, _ in hot.hot_layers(model)) == ["enc.0", "enc.2"]
    assert "stem" in hot.summary(model).left["filtered"]
    with pytest.raises(hot.HOTConfigError, match="module_filter_fn or filter"):
        hot.convert(_net(), filter=lambda f, m: True, module_filter_fn=no_convs)


def test_warns_when_nothing_converts_and_when_a_chosen_layer_stays_by_default():
    msgs = _convert(nn.Sequential(nn.Conv2d(4, 4, 3, groups=4)))
    assert len(msgs) == 1 and "no layer of Sequential was converted" in msgs[0]
    assert "groups=4" in msgs[0] and "hot.summary" in msgs[0]
    model = _net()
    msgs = _convert(model, filter=lambda fqn, m: fqn == "head")
    assert len(msgs) == 1 and "no layer of Net" in msgs[0], msgs
    assert "convert_head=True" in msgs[0] and "'head'" in msgs[0]
    assert hot.summary(model).left["output head"] == ("head",)


def test_summary_table_reasons_and_layers_convert_never_saw():
    model = _net()
    _convert(model, config=hot.HOTConfig(min_in_features=10))  # enc.0 has 8 inputs
    model.extra = nn.Linear(8, 8)  # added after the conversion
    s = hot.summary(model)
    assert s.exact == ("enc.0",) and set(s.converted) == {"stem", "enc.2"}
    text = str(s)
    assert text.splitlines()[0].startswith(f"HOT backward on {len(s.converted)} of 7 ")
    assert "left: output head" in text and "groups=8" in text
    assert s.left["not converted (hot.convert did not see it)"] == ("extra",)
    assert s.to_dict()["left"]["output head"] == ["head"]
    assert s.quantized_forward == () and "forward GEMM quantized" not in text
    hot.unconvert(model)
    assert hot.summary(model).converted == ()
    _convert(model, config=hot.HOTConfig.quantized().replace(min_in_features=10))
    s = hot.summary(model)
    assert set(s.quantized_forward) == set(s.converted) and "enc.0" not in s.quantized_forward
    assert str(s).splitlines()[0].endswith(
        f"; forward GEMM quantized too on {len(s.converted)} of them")


def test_lora_adapters_stay_exact_unless_asked_and_the_base_layer_converts():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_net(), peft.LoraConfig(r=2, target_modules=["enc.0", "enc.2"]))
    assert _convert(model) == []
    names = {n for n, _ in hot.hot_layers(model)}
    assert {n for n in names if "enc" in n} == {
        "base_model.model.enc.0.base_layer", "base_model.model.enc.2.base_layer"}
    left = hot.summary(model).left
    assert len(left["LoRA adapter"]) == 4 and left["output head"] == ("base_model.model.head",)
    _convert(model, convert_adapters=True)
    assert len([n for n, _ in hot.hot_layers(model) if ".lora_" in n]) == 4
