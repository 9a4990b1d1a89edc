"""What PyTorch accepts, a HOT model accepts too, and nothing is silently wrong: which modules
convert, state under casts / meta init / checkpoints, empty inputs, double backward, RNG use,
LQS at the edges, and configs of the wrong type."""

from __future__ import annotations

import copy
import io
import warnings

import pytest
import torch
import torch.nn as nn
from torch.nn.modules.linear import NonDynamicallyQuantizableLinear

import hot
from hot.common import lqs


def _quiet_convert(model, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hot.convert(model, *args, **kw)


# ---------------------------------------------------------------- which modules convert


class StandardizedConv(nn.Conv2d):
    """A subclass with its own forward (weight standardization, like timm's StdConv2d)."""

    def forward(self, x):
        w = (self.weight - self.weight.mean((1, 2, 3), keepdim=True))
        return self._conv_forward(x, w, self.bias)


class TaggedLinear(nn.Linear):
    """A subclass that keeps nn.Linear's forward and adds a method."""

    def tag(self):
        return "tagged"


def test_subclass_with_its_own_forward_stays_and_one_warning_names_it():
    torch.manual_seed(0)
    model = nn.Sequential(StandardizedConv(3, 4, 3), StandardizedConv(4, 4, 3), nn.Flatten(),
                          nn.LazyLinear(2))
    x = torch.randn(2, 3, 7, 7)
    model(x)  # materializes the lazy layer
    want = model(x)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        hot.convert(model, hot.HOTConfig.exact(), backend="reference")
    msgs = [str(m.message) for m in w]
    assert len(msgs) == 1 and "StandardizedConv" in msgs[0] and "'0'" in msgs[0], msgs
    assert type(model[0]) is StandardizedConv and type(model[1]) is StandardizedConv
    assert isinstance(model[3], hot.HOTLinear)  # materialized: converts
    assert torch.equal(model(x), want)


def test_lazy_module_before_its_first_forward_stays_with_a_note():
    model = nn.Sequential(nn.LazyLinear(3))
    with pytest.warns(UserWarning, match="lazy.*run one forward"):
        hot.convert(model, backend="reference")
    assert isinstance(model[0], nn.LazyLinear)
    model(torch.randn(2, 5)).sum().backward()  # still works as a plain layer


def test_subclass_keeping_the_parent_forward_converts_and_unconverts_to_itself():
    net = nn.Sequential(NonDynamicallyQuantizableLinear(4, 4), TaggedLinear(4, 4))
    ids = [id(p) for p in net.parameters()]
    hot.convert(net, backend="reference")
    assert isinstance(net[0], hot.HOTLinear) and isinstance(net[0], NonDynamicallyQuantizableLinear)
    assert isinstance(net[1], TaggedLinear) and net[1].tag() == "tagged"
    net(torch.randn(3, 4, requires_grad=True)).sum().backward()
    for m in (copy.deepcopy(net), _pickled(net)):  # the run-time HOT classes survive both
        assert isinstance(m[1], hot.HOTLinear) and m[1].tag() == "tagged"
        assert m[1].hot_step_value() == 1
    hot.unconvert(net)
    assert type(net[0]) is NonDynamicallyQuantizableLinear and type(net[1]) is TaggedLinear
    assert [id(p) for p in net.parameters()] == ids


def _pickled(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


@pytest.mark.parametrize("name", ["tf_mobilenetv3_small_minimal_100", "resnetv2_50x1_bit",
                                  "nf_resnet26"])
def test_timm_models_compute_the_same_forward_after_exact_conversion(name):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5).eval()
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        want = model(x)
    _quiet_convert(model, hot.HOTConfig.exact(), backend="reference")
    with torch.no_grad():
        assert torch.equal(model(x), want)


def test_conv2d_same_keeps_its_output_shape():
    timm = pytest.importorskip("timm")
    from timm.layers import Conv2dSame

    model = nn.Sequential(Conv2dSame(3, 8, 3, stride=2))
    x = torch.randn(2, 3, 9, 9)
    shape = model(x).shape
    _quiet_convert(model, backend="reference")
    assert model(x).shape == shape == (2, 8, 5, 5)
    del timm


def test_root_layer_converts_and_the_result_is_returned():
    lin = nn.Linear(4, 3)
    out = hot.convert(lin, backend="reference")
    assert isinstance(out, hot.HOTLinear) and out.weight is lin.weight
    assert hot.unconvert(out).__class__ is nn.Linear


def test_multihead_attention_projections_are_left_alone():
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    hot.convert(layer, backend="reference")
    assert sorted(n for n, _ in hot.hot_layers(layer)) == ["linear1", "linear2"]
    assert type(layer.self_attn.out_proj) is NonDynamicallyQuantizableLinear


def test_filter_in_torchao_order_is_detected_and_module_filter_fn_accepted():
    for kw in (dict(filter=lambda mod, fqn: fqn == "1"),
               dict(module_filter_fn=lambda m, name: name == "1")):
        net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        hot.convert(net, backend="reference", **kw)
        assert [n for n, _ in hot.hot_layers(net)] == ["1"]


# ---------------------------------------------------------------- state, casts, checkpoints


def _trained():
    torch.manual_seed(0)
    net = hot.convert(nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4)),
                      backend="reference")
    net(torch.randn(64, 32)).square().mean().backward()
    return net


def test_half_keeps_the_state_and_calibrates_without_inf():
    torch.manual_seed(0)
    net = hot.convert(nn.Sequential(nn.Linear(32, 16)), backend="reference").half()
    assert int(net[0].hot_step) == 0 and int(net[0].hot_lqs) == -1
    net.float()
    x = torch.randn(64, 32)
    net(x).square().mean().backward()
    assert net[0].hot_lqs_value() in (0, 1) and int(net[0].hot_lqs) == net[0].hot_lqs_value()


def test_meta_init_then_to_empty_gives_a_fresh_state():
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(8, 8))
    hot.convert(net, backend="reference")
    net.to_empty(device="cpu")
    assert int(net[0].hot_step) == 0 and int(net[0].hot_lqs) == -1
    assert net[0].hot_step_value() == 0 and net[0].hot_lqs_value() == -1


@pytest.mark.parametrize("assign", [False, True])
def test_checkpoint_restores_the_state(assign):
    src = _trained()
    dst = hot.convert(nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4)),
                      backend="reference")
    dst.load_state_dict(src.state_dict(), assign=assign)
    for a, b in zip((m for _, m in hot.hot_layers(src)), (m for _, m in hot.hot_layers(dst))):
        assert b.hot_step_value() == a.hot_step_value() == int(b.hot_step) == 1
        assert b.hot_lqs_value() == a.hot_lqs_value() == int(b.hot_lqs)


def test_hot_checkpoint_loads_strictly_into_the_plain_model():
    src = _trained()
    plain = nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4))
    with pytest.raises(RuntimeError, match="hot_step"):
        plain.load_state_dict(src.state_dict())  # what plain_state_dict is for
    plain.load_state_dict(hot.plain_state_dict(src))
    x = torch.randn(5, 32)
    assert torch.equal(plain(x), src(x))


def test_a_corrupt_lqs_value_is_refused():
    src = _trained()
    sd = src.state_dict()
    sd["0.hot_lqs"] = torch.tensor(7, dtype=torch.int8)
    dst = hot.convert(nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4)),
                      backend="reference")
    with pytest.raises(RuntimeError, match="hot_lqs = 7"):
        dst.load_state_dict(sd)


# ---------------------------------------------------------------- inputs PyTorch accepts


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8)])
def test_empty_input_behaves_like_nn_linear(shape):
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    net = hot.convert(nn.Sequential(copy.deepcopy(lin)), backend="reference")
    x = torch.randn(shape, requires_grad=True)
    y = net(x)
    assert y.shape == (*shape[:-1], 4)
    y.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.equal(net[0].weight.grad, torch.zeros(4, 8))
    assert torch.equal(net[0].bias.grad, torch.zeros(4))
    # The next, non-empty call quantizes as usual.
    net(torch.randn(16, 8)).sum().backward()
    assert net[0].hot_step_value() == 2


def test_empty_conv_batch_and_unbatched_conv_input():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    net = hot.convert(nn.Sequential(copy.deepcopy(conv)), hot.HOTConfig.exact(),
                      backend="reference")
    x = torch.randn(3, 6, 6, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    y, yr = net(x), conv(xr)
    assert torch.equal(y, yr) and y.shape == (4, 6, 6)
    y.square().sum().backward()
    yr.square().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-6)
    e = torch.randn(0, 3, 6, 6, requires_grad=True)
    net(e).sum().backward()
    assert e.grad.shape == e.shape


def test_double_backward_raises_instead_of_a_wrong_hessian_vector_product():
    net = hot.convert(nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1)),
                      hot.HOTConfig.exact(), backend="reference")
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match="HOT layer '2': a higher-order gradient"):
        torch.autograd.grad(net(x).sum(), x, create_graph=True)


@pytest.mark.parametrize("cfg", [hot.HOTConfig.exact(), hot.HOTConfig()])
def test_no_draw_from_torch_generators(cfg):
    """Dropout masks (and anything else drawn from torch's generator) are those of the
    unconverted model under the same seed: HOT draws nothing from it."""
    def run(convert):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 4))
        if convert:
            hot.convert(net, cfg, backend="reference")
        torch.manual_seed(1)
        outs = []
        for _ in range(2):
            y = net(torch.ones(8, 16))
            y.sum().backward()
            outs.append((y != 0).float().detach())
        return outs, torch.get_rng_state()

    (plain, s1), (conv, s2) = run(False), run(True)
    assert torch.equal(s1, s2)
    if cfg == hot.HOTConfig.exact():
        for a, b in zip(plain, conv):
            assert torch.equal(a, b)


# ---------------------------------------------------------------- LQS at the edges


def _gy(seed=0, tokens=64, width=32):
    return torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed))


def test_lqs_one_extreme_outlier_token_chooses_per_token():
    """One token 1e4 times the others: per-tensor scaling would leave the other 63 tokens below
    one quantization step (no signal), so per-token must win."""
    gy = _gy()
    gy[5] *= 1e4
    assert lqs.choose(lqs.statistics(gy, 4), 0.5) == lqs.TOKEN
    assert lqs.choose(lqs.statistics(_gy(), 4), 0.5) == lqs.TENSOR  # similar tokens: per tensor


@pytest.mark.parametrize("scale", [1e-30, 1e-23, 1e19, 1e30])
def test_lqs_decision_does_not_depend_on_the_scale_of_g_y(scale):
    gy = _gy(1)
    gy[[3, 17, 40]] *= 100
    ref = lqs.statistics(gy, 4)
    got = lqs.statistics(gy * scale, 4)
    assert float(got[2]) == 64
    torch.testing.assert_close(got[:2], ref[:2], rtol=1e-4, atol=0)
    assert lqs.choose(got, 0.5) == lqs.choose(ref, 0.5)


def test_lqs_ignores_zero_tokens_and_non_finite_passes():
    gy = _gy(2)
    gy[10:] = 0
    stats = lqs.statistics(gy, 4)
    assert float(stats[2]) == 10
    gy[0, 0] = float("nan")
    assert torch.equal(lqs.statistics(gy, 4), torch.zeros(3, dtype=torch.float64))
    assert torch.equal(lqs.statistics(torch.zeros(0, 32), 4), torch.zeros(3, dtype=torch.float64))


def test_lqs_keeps_calibrating_after_passes_with_nothing_to_learn():
    net = hot.convert(nn.Sequential(nn.Linear(16, 32)), backend="reference")
    x = torch.randn(64, 16)
    net(x).backward(torch.zeros(64, 32))  # nothing to learn: stays undecided
    assert net[0].hot_lqs_value() == -1
    net(x).backward(torch.randn(64, 32))
    assert net[0].hot_lqs_value() in (0, 1)


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("make,field", [
    (lambda: hot.HOTConfig(hq={"bits": 8}), "HOTConfig.hq"),
    (lambda: hot.HQConfig(bits=4.0), "HQConfig.bits"),
    (lambda: hot.HLAConfig(rank=8.0), "HLAConfig.rank"),
    (lambda: hot.HOTConfig(seed="abc"), "HOTConfig.seed"),
    (lambda: hot.LQSConfig(ratio="0.5"), "LQSConfig.ratio"),
    (lambda: hot.HQConfig(gy_scale=1), "HQConfig.gy_scale"),
    (lambda: hot.HOTConfig().replace(hq={"bitz": 4}), "bitz"),
    (lambda: hot.HOTConfig.from_dict({"sed": 1}), "sed"),
])
def test_config_values_of_the_wrong_type_name_the_field(make, field):
    with pytest.raises(hot.HOTConfigError, match=field):
        make()


def test_lqs_statistic_is_the_same_measured_in_row_chunks(monkeypatch):
    """The statistic is a sum over tokens, measured a slice of rows at a time for wide g_y (an LM
    head's vocabulary would otherwise take a float32 copy of its whole transform): chunks of
    3 rows give the one-chunk value up to float64 summation order."""
    gy = _gy(3, tokens=40, width=48)
    gy[7] *= 50
    gy[20:23] = 0
    whole = lqs.statistics(gy, 4)
    monkeypatch.setattr(lqs, "_CHUNK_ELEMENTS", 3 * 48)
    chunked = lqs.statistics(gy, 4)
    assert float(chunked[2]) == float(whole[2]) == 37
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=0)


def test_layers_narrower_than_min_in_features_run_exactly():
    """min_in_features=32: the last, 16-wide layer (which gets the loss's exact g_y) has
    autograd's gradients up to float32 rounding; the 32-wide first layer's are HOT's (quantized:
    far from exact)."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 8))
    net = hot.convert(copy.deepcopy(plain), hot.HOTConfig(min_in_features=32), backend="reference")
    x = torch.randn(64, 32)
    plain(x).square().sum().backward()
    net(x).square().sum().backward()
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(net[2].weight.grad, plain[2].weight.grad) < 1e-5  # exact
    assert rel(net[0].weight.grad, plain[0].weight.grad) > 1e-2  # quantized
    assert net[2].hot_step_value() == 1  # counted all the same


def test_narrow_layers_are_capturable_before_lqs_decides(monkeypatch):
    """A layer narrower than min_in_features runs exactly on every call, so a CUDA graph may
    capture it while LQS is undecided; a HOT layer in that state may not (its decision would be
    frozen into the graph). The capture state is faked: the check needs no GPU."""
    from hot.nn import autograd

    net = hot.convert(nn.Sequential(nn.Linear(32, 16), nn.Linear(16, 8)),
                      hot.HOTConfig(min_in_features=32))
    assert net[0].hot_lqs_value() < 0 and net[1].hot_lqs_value() < 0
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    cuda = torch.device("cuda")
    autograd._check_capturable(net[1], cuda)  # 16 < 32: exact, nothing to decide
    with pytest.raises(RuntimeError, match="'0' cannot be captured in a CUDA graph"):
        autograd._check_capturable(net[0], cuda)
