"""HLA's drawn row selection (HLAConfig(selection="stratified")) is an unbiased estimator of g_W.

Monte-Carlo: each backward call of a layer draws new rows (and new rounding), so the mean of n
calls' g_W on the same x and g_y converges to the exact g_W = g_y^T x. For an unbiased
estimator with per-call covariance of trace s2 (estimated from the same draws), the squared
error of the mean of n independent calls has expectation s2 / n; we assert it stays below
3 s2 / n (its relative spread is about sqrt(2 / d) for d = O * I >= 384 entries, so 3 is many
standard deviations away), and that it falls like 1/sqrt(n): the error of 256 calls is at least
2.5 times smaller than that of 16 (4 expected). The paper's fixed low-pass fails both (its bias
does not average out), on inputs where it keeps about half of g_y's energy: g_y white along the
tokens, x smooth along them (as real activations are).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hot

N_SMALL, N_LARGE = 16, 256


def _inputs(tokens: int, cin: int, cout: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    # x smooth along the tokens (a random walk) plus noise; g_y white
    x = torch.randn(tokens, cin, generator=g).cumsum(0) / tokens ** 0.5 + 0.3 * torch.randn(
        tokens, cin, generator=g)
    gy = torch.randn(tokens, cout, generator=g)
    return x, gy


def _config(selection: str, quantized: bool, abc: str) -> hot.HOTConfig:
    hla = hot.HLAConfig(selection=selection, abc=abc, bits=8 if quantized else None)
    return hot.HOTConfig(hq=hot.HQConfig(bits=8 if quantized else None), hla=hla, seed=3)


def _linear_draws(cfg, n, x, gy):
    torch.manual_seed(0)
    layer = hot.convert(nn.Linear(x.shape[1], gy.shape[1], bias=False), cfg, backend="reference")
    out = []
    for _ in range(n):
        layer.weight.grad = None
        layer(x.requires_grad_(False)).backward(gy)
        out.append(layer.weight.grad.double().clone())
    return torch.stack(out), (gy.t().double() @ x.double())


def _conv_draws(cfg, n, seed):
    g = torch.Generator().manual_seed(seed)
    # a smooth image (so the patch rows are smooth along the tokens) and a white g_y
    img = torch.randn(2, 3, 12, 12, generator=g).cumsum(-1).cumsum(-2) / 12
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    ref = nn.Conv2d(3, 8, 3, padding=1, bias=False)
    ref.load_state_dict(conv.state_dict())
    gy = torch.randn(2, 8, 12, 12, generator=g)
    ref(img).backward(gy)
    layer = hot.convert(conv, cfg, backend="reference")
    out = []
    for _ in range(n):
        layer.weight.grad = None
        layer(img).backward(gy)
        out.append(layer.weight.grad.double().clone())
    return torch.stack(out), ref.weight.grad.double()


def _errors(draws, exact):
    """(squared error of the mean of the first N_SMALL and of all draws, per-draw s2)."""
    s2 = (draws - draws.mean(0)).pow(2).sum(tuple(range(1, draws.dim()))).mean()
    e_small = (draws[:N_SMALL].mean(0) - exact).pow(2).sum()
    e_large = (draws.mean(0) - exact).pow(2).sum()
    return float(e_small), float(e_large), float(s2)


def _assert_unbiased(draws, exact):
    e_small, e_large, s2 = _errors(draws, exact)
    assert e_large <= 3 * s2 / N_LARGE, (e_large, s2 / N_LARGE)
    assert (e_small / e_large) ** 0.5 >= 2.5, (e_small, e_large)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("abc", ["save", "recompute"])
def test_linear_gw_mean_converges_to_exact(quantized, abc):
    x, gy = _inputs(96, 24, 16, seed=1)
    draws, exact = _linear_draws(_config("stratified", quantized, abc), N_LARGE, x, gy)
    _assert_unbiased(draws, exact)


@pytest.mark.parametrize("quantized", [False, True])
@pytest.mark.parametrize("abc", ["save", "recompute"])
def test_conv_gw_mean_converges_to_exact(quantized, abc):
    draws, exact = _conv_draws(_config("stratified", quantized, abc), N_LARGE, seed=2)
    _assert_unbiased(draws, exact)


def test_lowpass_is_biased_where_the_drawn_selection_is_not():
    """The check above can fail: the paper's low-pass keeps a fixed half of g_y's energy, so
    its mean stays at its bias (the same g_W every call without quantization)."""
    x, gy = _inputs(96, 24, 16, seed=1)
    draws, exact = _linear_draws(_config("lowpass", False, "save"), N_SMALL, x, gy)
    bias = float((draws.mean(0) - exact).pow(2).sum() / exact.pow(2).sum()) ** 0.5
    assert bias > 0.3  # about half of a white g_y's energy is dropped
    with pytest.raises(AssertionError):
        _assert_unbiased(torch.cat([draws] * (N_LARGE // N_SMALL)), exact)


def test_x_and_g_y_keep_the_same_rows_when_another_backward_runs_between():
    """A layer called twice before its backwards (shared weights): each backward draws g_y's
    rows with its own forward's step, so the sum stays unbiased."""
    x, gy = _inputs(64, 16, 8, seed=4)
    cfg = _config("stratified", False, "save")
    torch.manual_seed(0)
    layer = hot.convert(nn.Linear(16, 8, bias=False), cfg, backend="reference")
    draws = []
    for _ in range(N_LARGE):
        layer.weight.grad = None
        y1, y2 = layer(x), layer(x)  # both forwards at one step
        torch.autograd.backward([y2, y1], [gy, gy])  # y2's backward first, then y1's
        draws.append(layer.weight.grad.double().clone())
    exact = 2 * gy.t().double() @ x.double()
    _assert_unbiased(torch.stack(draws), exact)


@pytest.mark.parametrize("abc", ["save", "recompute"])
def test_sibling_layer_gw_mean_converges_to_exact(abc):
    """HLAConfig(share="siblings"): the second of two sibling layers draws its rows and rounds
    x with the first one's seeds (hot.nn.groups); its g_W is still unbiased (same bound)."""
    x, gy = _inputs(96, 24, 16, seed=4)
    cfg = _config("stratified", True, abc).replace(hla={"share": "siblings"})
    torch.manual_seed(0)
    pair = hot.convert(nn.ModuleDict({"a": nn.Linear(24, 16, bias=False),
                                      "b": nn.Linear(24, 16, bias=False)}), cfg,
                       backend="reference")
    ref = torch.randn(96, 16, generator=torch.Generator().manual_seed(5))
    out = []
    for _ in range(N_LARGE):
        pair["b"].weight.grad = None
        ((pair["a"](x) * ref).sum() + (pair["b"](x) * gy).sum()).backward()
        out.append(pair["b"].weight.grad.double().clone())
    _assert_unbiased(torch.stack(out), gy.t().double() @ x.double())
