"""LQS: the per-layer choice between per-token and per-tensor scaling of g_y on the g_x path."""

import pytest
import torch
import torch.nn as nn

import hot
from hot.common import ops
from hot_testing import hot_copy, wrap

TOKENS, IN_F, OUT_F = 64, 24, 32


def _outlier_gy(seed=0):
    g = torch.Generator().manual_seed(seed)
    gy = torch.randn(TOKENS, OUT_F, generator=g)
    gy[[3, 17, 40]] *= 100  # a few tokens carry most of the gradient, as in transformers
    return gy


def _gaussian_gy(seed=0):
    return torch.randn(TOKENS, OUT_F, generator=torch.Generator().manual_seed(seed))


def _model(cfg=None):
    torch.manual_seed(0)
    return hot_copy(wrap(nn.Linear(IN_F, OUT_F)), cfg or hot.HOTConfig())


def _step(model, gy):
    x = torch.randn(TOKENS, IN_F, requires_grad=True)
    model(x).backward(gy)


@pytest.fixture
def gy_modes(monkeypatch):
    """Records the scale mode of every HQ quantization of g_y (the W^T call has IN_F rows), at
    the reference backend's registered implementation, which both the plain and the fused g_y
    operations reach."""
    seen = []
    real = ops.implementation("hq_quantize", ops.DEFAULT)

    def spy(x, a):
        if x.shape == (TOKENS, OUT_F):
            seen.append(a.scale_mode)
        return real(x, a)

    monkeypatch.setitem(ops._IMPLS["hq_quantize"], ops.DEFAULT, spy)
    return seen


def test_outlier_tokens_choose_per_token(gy_modes):
    model = _model()
    assert int(model[0].hot_lqs) == -1
    _step(model, _outlier_gy())
    assert int(model[0].hot_lqs) == 1 and model[0].hot_lqs_value() == 1
    _step(model, _gaussian_gy())  # decided: no more calibration
    assert int(model[0].hot_lqs) == 1
    assert gy_modes == ["row", "row"]


def test_gaussian_gradient_chooses_per_tensor(gy_modes):
    model = _model()
    _step(model, _gaussian_gy())
    assert int(model[0].hot_lqs) == 0
    _step(model, _outlier_gy())
    assert int(model[0].hot_lqs) == 0
    assert gy_modes == ["row", "tensor"]  # per-token while calibrating, then the choice


def test_choice_survives_state_dict_round_trip_into_fresh_model(gy_modes):
    model = _model()
    _step(model, _outlier_gy())
    sd = model.state_dict()
    assert int(sd["0.hot_lqs"]) == 1 and int(sd["0.hot_step"]) == 1
    fresh = _model()
    fresh.load_state_dict(sd)
    assert int(fresh[0].hot_lqs) == 1 and fresh[0].hot_lqs_value() == 1
    assert int(fresh[0].hot_step) == 1 and fresh[0].hot_step_value() == 1
    gy_modes.clear()
    _step(fresh, _gaussian_gy())  # would choose per-tensor if it calibrated again
    assert gy_modes == ["row"] and int(fresh[0].hot_lqs) == 1

    model = _model()
    _step(model, _gaussian_gy())
    fresh = _model()
    fresh.load_state_dict(model.state_dict())
    gy_modes.clear()
    _step(fresh, _outlier_gy())
    assert gy_modes == ["tensor"] and fresh[0].hot_lqs_value() == 0


@pytest.mark.parametrize("forced,mode", [("token", "row"), ("tensor", "tensor")])
def test_forcing_skips_calibration(gy_modes, forced, mode):
    model = _model(hot.HOTConfig(hq=hot.HQConfig(gy_scale=forced)))
    _step(model, _outlier_gy())
    _step(model, _gaussian_gy())
    assert gy_modes == [mode, mode]
    assert int(model[0].hot_lqs) == -1  # never calibrated


def test_forced_tensor_scale_really_hurts_on_outliers():
    """Why LQS exists: with outlier tokens a per-tensor scale is ~100x too coarse for the other
    rows. Mean squared g_x error on the normal rows over 5 seeds, token vs tensor; stochastic
    rounding's expected error grows with the step squared, so the ratio is ~10^3."""
    errs = {}
    gy = _outlier_gy()
    normal = [i for i in range(TOKENS) if i not in (3, 17, 40)]
    for forced in ("token", "tensor"):
        model = _model(hot.HOTConfig(hq=hot.HQConfig(gy_scale=forced)))
        w = model[0].weight.detach()
        e = 0.0
        for s in range(5):
            torch.manual_seed(s)
            x = torch.randn(TOKENS, IN_F, requires_grad=True)
            model(x).backward(gy)
            e += ((x.grad - gy @ w)[normal] ** 2).mean().item()
        errs[forced] = e
    assert errs["tensor"] > 100 * errs["token"], errs


def test_calibration_steps_decide_after_that_many_backward_passes(gy_modes):
    model = _model(hot.HOTConfig(lqs=hot.LQSConfig(calibration_steps=3)))
    for k in range(2):
        _step(model, _outlier_gy(k))
        assert int(model[0].hot_lqs) == -1, k
    _step(model, _outlier_gy(2))
    assert int(model[0].hot_lqs) == 1
    assert gy_modes == ["row"] * 3
    # Errors are summed over the calibration passes: two Gaussian passes and one with outliers
    # still see the outliers' large per-tensor error.
    model = _model(hot.HOTConfig(lqs=hot.LQSConfig(calibration_steps=3)))
    for gy in (_gaussian_gy(0), _gaussian_gy(1), _gaussian_gy(2)):
        _step(model, gy)
    assert int(model[0].hot_lqs) == 0


def test_no_decision_while_exact():
    model = _model(hot.HOTConfig(exact_steps=2))
    _step(model, _outlier_gy())
    _step(model, _outlier_gy())
    assert int(model[0].hot_lqs) == -1
    _step(model, _outlier_gy())
    assert int(model[0].hot_lqs) == 1


@pytest.mark.parametrize("bad", ["nonfinite", "zeros"])
def test_uninformative_pass_does_not_lock_in_a_decision(bad):
    # An AMP overflow step (Inf in g_y) or an all-zero g_y must not decide LQS: the layer keeps
    # calibrating and decides on the next informative pass (here: outliers -> per-token).
    model = _model()
    gy = torch.zeros(TOKENS, OUT_F)
    if bad == "nonfinite":
        gy = _gaussian_gy()
        gy[5, 3] = float("inf")
    _step(model, gy)
    assert model[0].hot_lqs_value() == -1
    _step(model, _outlier_gy())
    assert model[0].hot_lqs_value() == 1
