"""HOT layers in use: gradient flags, seeds, bad input, non-finite and zero gradients, the
exact/INT8 schedule, set_config, autocast."""

import copy

import pytest
import torch
import torch.nn as nn

import hot
from hot_testing import gamma, grads, hot_copy, ones_blocks, wrap

U32 = 2.0**-24


def _gamma32(n):
    return n * U32 / (1 - n * U32)


def _lin(i=24, o=20, bias=True, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(i, o, bias=bias).to(dtype)


def _rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


# --- gradient flags -----------------------------------------------------------------------

def test_frozen_weight_no_gw_and_exact_gx():
    plain = _lin(dtype=torch.float64)
    plain.weight.requires_grad_(False)
    model = hot_copy(wrap(plain), hot.HOTConfig.exact())
    x = torch.randn(3, 7, 24, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(3, 7, 20, dtype=torch.float64)
    gx, g = grads(model, x, gy)
    gx_ref, _ = grads(wrap(plain), x, gy)
    assert g["0.weight"] is None and g["0.bias"] is not None
    bound = (gamma(16 + 32) + gamma(20)) * (gy.abs() @ ones_blocks(20) @ plain.weight.abs())
    assert ((gx - gx_ref).abs() <= bound).all()


def test_frozen_layer_with_nothing_to_differentiate_is_plain():
    plain = _lin()
    for p in plain.parameters():
        p.requires_grad_(False)
    model = hot_copy(wrap(plain), hot.HOTConfig())
    y = model(torch.randn(5, 24))
    assert not y.requires_grad and int(model[0].hot_step) == 0


def test_input_without_grad_runs_only_gw():
    model = hot_copy(wrap(_lin()), hot.HOTConfig())
    x = torch.randn(16, 24)
    model(x).sum().backward()
    assert x.grad is None
    assert model[0].weight.grad is not None and torch.isfinite(model[0].weight.grad).all()


# --- seeds --------------------------------------------------------------------------------

def _paper_grads(model, seed_before=None, x_seed=1):
    g = torch.Generator().manual_seed(x_seed)
    x = torch.randn(32, 24, generator=g, requires_grad=True)
    gy = torch.randn(32, 20, generator=g)
    if seed_before is not None:
        torch.manual_seed(seed_before)
    return grads(model, x, gy)


def test_same_torch_seed_same_gradients_different_seed_different():
    base = hot_copy(wrap(_lin()), hot.HOTConfig())
    m1, m2, m3 = (hot_copy(base, hot.HOTConfig()) for _ in range(3))
    gx1, g1 = _paper_grads(m1, seed_before=5)
    gx2, g2 = _paper_grads(m2, seed_before=5)
    gx3, g3 = _paper_grads(m3, seed_before=6)
    assert torch.equal(gx1, gx2) and torch.equal(g1["0.weight"], g2["0.weight"])
    assert not torch.equal(gx1, gx3) and not torch.equal(g1["0.weight"], g3["0.weight"])


def test_config_seed_is_deterministic_and_leaves_torch_rng_alone():
    cfg = hot.HOTConfig(seed=1234)
    base = hot_copy(wrap(_lin()), cfg)
    m1, m2 = hot_copy(base, cfg), hot_copy(base, cfg)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    gx1, g1 = _paper_grads(m1)
    assert torch.equal(torch.get_rng_state(), state), "HOT consumed torch's generator"
    torch.manual_seed(99)  # a different torch state must not matter
    gx2, g2 = _paper_grads(m2)
    assert torch.equal(gx1, gx2) and torch.equal(g1["0.weight"], g2["0.weight"])
    # The next step draws new numbers (seeds depend on the step) ...
    gx1b, _ = _paper_grads(m1)
    assert not torch.equal(gx1, gx1b)
    # ... and another config seed gives other numbers.
    m3 = copy.deepcopy(base)
    hot.set_config(m3, hot.HOTConfig(seed=1235))  # convert() leaves HOT layers as they are
    gx3, _ = _paper_grads(m3)
    assert not torch.equal(gx1, gx3)


# --- bad input, zero and non-finite gradients -----------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_unsupported_input_dtype_names_the_layer(dtype):
    model = hot.convert(nn.Sequential(nn.Linear(8, 4)), backend="reference")
    model.add_module("enc", hot.convert(nn.Sequential(nn.Linear(8, 4)), backend="reference"))
    x = torch.zeros(3, 8).to(dtype)
    with pytest.raises(hot.HOTLayerError, match=rf"'0'.*{str(dtype)}"):
        model[0](x)
    with pytest.raises(hot.HOTLayerError, match=r"'0'"):
        model.enc(x)


def test_wrong_feature_count_and_conv_rank_name_the_layer():
    model = hot.convert(nn.Sequential(nn.Linear(8, 4), nn.Conv2d(1, 2, 3)), backend="reference")
    with pytest.raises(hot.HOTLayerError, match=r"'0'.*in_features=8"):
        model[0](torch.randn(2, 9))
    with pytest.raises(hot.HOTLayerError, match=r"'1'.*\(N, C, H, W\) or \(C, H, W\)"):
        model[1](torch.randn(5, 5))


@pytest.mark.parametrize("cfg", [hot.HOTConfig(), hot.HOTConfig(hq=hot.HQConfig(gy_scale="tensor"))])
def test_all_zero_gy_gives_exact_zero_gradients(cfg):
    model = hot_copy(wrap(_lin()), cfg)
    x = torch.randn(32, 24, requires_grad=True)
    gx, g = grads(model, x, torch.zeros(32, 20))
    for t in (gx, g["0.weight"], g["0.bias"]):
        assert torch.equal(t, torch.zeros_like(t))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_non_finite_gy_gives_non_finite_gradients(bad, layer):
    torch.manual_seed(0)
    if layer == "linear":
        model = hot_copy(wrap(nn.Linear(24, 20)), hot.HOTConfig())
        x = torch.randn(32, 24, requires_grad=True)
        gy = torch.randn(32, 20)
        gy[5, 3] = bad
    else:
        model = hot_copy(wrap(nn.Conv2d(3, 8, 3, padding=1)), hot.HOTConfig())
        x = torch.randn(2, 3, 4, 4, requires_grad=True)
        gy = torch.randn(2, 8, 4, 4)
        gy[1, 2, 0, 0] = bad
    gx, g = grads(model, x, gy)
    for name, t in (("g_x", gx), ("g_W", g["0.weight"])):
        assert not torch.isfinite(t).all(), name


def test_grad_scaler_skips_the_step_on_overflow():
    """The point of carrying NaN/Inf: torch.amp.GradScaler sees it and skips the update."""
    torch.manual_seed(0)
    model = hot_copy(wrap(nn.Linear(24, 20)), hot.HOTConfig())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    before = model[0].weight.detach().clone()
    x = torch.randn(32, 24)
    loss = model(x).sum() * 1e36  # times the scale 2^10: g_y = 1e39 overflows to inf
    scaler.scale(loss).backward()
    assert not torch.isfinite(model[0].weight.grad).all()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model[0].weight, before)
    assert scaler.get_scale() < 2.0**10


# --- schedule: exact_steps, int8_steps, set_config -------------------------------------------

def _fp32_gx_bound(gy, w):
    """|HOT exact step - autograd| for g_x = g_y W in float32: both are float32 products with
    O-term sums, so <= 2 gamma_O(u32) |g_y| |W|."""
    return 2 * _gamma32(w.shape[0]) * (gy.abs() @ w.abs())


def test_exact_steps_then_hot():
    plain = _lin()
    model = hot_copy(wrap(plain), hot.HOTConfig(exact_steps=2))
    x = torch.randn(32, 24, requires_grad=True)
    gy = torch.randn(32, 20)
    gx_ref, g_ref = grads(wrap(plain), x, gy)
    bound = _fp32_gx_bound(gy, plain.weight.detach())
    gw_bound = 2 * _gamma32(32) * (gy.abs().T @ x.detach().abs())
    for step in range(2):
        gx, g = grads(model, x, gy)
        assert ((gx - gx_ref).abs() <= bound).all(), step
        assert ((g["0.weight"] - g_ref["0.weight"]).abs() <= gw_bound).all(), step
    gx, g = grads(model, x, gy)
    assert ((gx - gx_ref).abs() > bound).float().mean() > 0.9
    assert ((g["0.weight"] - g_ref["0.weight"]).abs() > gw_bound).float().mean() > 0.9
    assert int(model[0].hot_step) == 3


def test_exact_from_cools_down_to_exact_gradients():
    """exact_from=1: step 0 runs HOT, steps 1 and 2 are exact again (within float32 rounding),
    also after a state_dict round trip into a fresh HOT copy, which resumes at step 2."""
    plain = _lin()
    cfg = hot.HOTConfig(exact_from=1)
    model = hot_copy(wrap(plain), cfg)
    x = torch.randn(32, 24, requires_grad=True)
    gy = torch.randn(32, 20)
    gx_ref, g_ref = grads(wrap(plain), x, gy)
    bound = _fp32_gx_bound(gy, plain.weight.detach())
    gw_bound = 2 * _gamma32(32) * (gy.abs().T @ x.detach().abs())

    def exact(m):
        gx, g = grads(m, x, gy)
        return (((gx - gx_ref).abs() <= bound).all()
                and ((g["0.weight"] - g_ref["0.weight"]).abs() <= gw_bound).all())

    assert not exact(model)
    assert exact(model)
    again = hot_copy(wrap(plain), cfg)
    again.load_state_dict(model.state_dict())
    assert exact(again) and int(again[0].hot_step) == 3


def test_int8_steps_then_4_bits():
    """The stochastic-rounding error is proportional to the step amax / qmax: 127 / 7 ~ 18x
    smaller at 8 bits for the same data (the f(1-f) factors average alike). One draw's relative
    error is an average over 32 x 24 elements, concentrated to ~10%, so requiring 4x is safe
    and still fails if 4 bits were used."""
    plain = _lin()
    model = hot_copy(wrap(plain), hot.HOTConfig(int8_steps=2,
                                                hq=hot.HQConfig(bits=4, gy_scale="token")))
    x = torch.randn(32, 24, requires_grad=True)
    gy = torch.randn(32, 20)
    exact = gy @ plain.weight.detach()
    errs = [_rel_err(grads(model, x, gy)[0], exact) for _ in range(4)]
    print("relative g_x errors, 2 x int8 then 2 x int4:", errs)
    assert max(errs[:2]) * 4 < min(errs[2:]), errs


def test_set_config_changes_bits_mid_training_and_keeps_state():
    plain = _lin(dtype=torch.float64)
    model = hot_copy(wrap(plain), hot.HOTConfig(hq=hot.HQConfig(bits=4)))
    x = torch.randn(32, 24, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(32, 20, dtype=torch.float64)
    exact = gy @ plain.weight.detach()
    e4 = _rel_err(grads(model, x, gy)[0], exact)
    lqs = int(model[0].hot_lqs)
    assert hot.set_config(model, hot.HOTConfig(hq=hot.HQConfig(bits=8))) == 1
    e8 = _rel_err(grads(model, x, gy)[0], exact)
    assert e8 * 4 < e4  # same argument as test_int8_steps_then_4_bits
    hot.set_config(model, hot.HOTConfig.exact())
    gx, _ = grads(model, x, gy)
    bound = (gamma(16 + 32) + gamma(20)) * (gy.abs() @ ones_blocks(20) @ plain.weight.abs())
    assert ((gx - exact).abs() <= bound).all()
    assert int(model[0].hot_step) == 3 and int(model[0].hot_lqs) == lqs


# --- autocast -----------------------------------------------------------------------------

@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_autocast_bf16_output_and_fp32_weight_grad(layer):
    torch.manual_seed(0)
    if layer == "linear":
        model = hot_copy(wrap(nn.Linear(24, 20)), hot.HOTConfig())
        x = torch.randn(4, 8, 24, requires_grad=True)
    else:
        model = hot_copy(wrap(nn.Conv2d(3, 8, 3)), hot.HOTConfig())
        x = torch.randn(2, 3, 6, 6, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
    assert y.dtype == torch.bfloat16
    y.float().square().mean().backward()
    assert model[0].weight.grad.dtype == torch.float32
    assert model[0].bias.grad.dtype == torch.float32
    assert x.grad.dtype == torch.float32
    for t in (x.grad, model[0].weight.grad):
        assert torch.isfinite(t).all() and t.abs().sum() > 0
    # The forward is autocast's own bf16 computation, unchanged by HOT.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_plain = hot.unconvert(hot_copy(model, hot.HOTConfig()))(x)
    assert torch.equal(y, y_plain)
