"""The baselines without a transform: naive INT4 (HOTConfig.int4(): both backward GEMMs on
4-bit operands quantized directly, one absmax scale per tensor, full rank; the forward keeps x)
and LUQ (HOTConfig.luq(): the same with g_y on 4-bit logarithmic levels)."""

import pytest
import torch
import torch.nn as nn

import hot
from hot.common import ops
from hot.common.config import HOTConfigError
from hot_testing import grads, hot_copy, projector, saved_by_forward, wrap


def _q4_nearest(t: torch.Tensor) -> torch.Tensor:
    """The baseline's quantizer with round-to-nearest, written directly: per-tensor absmax / 7."""
    t = t.double()
    s = t.abs().max() / 7
    return torch.round(t / s).clamp(-7, 7) * s


def _nearest():
    return hot.HOTConfig.int4().replace(
        hq={"gy_rounding": "nearest", "w_rounding": "nearest"}, hla={"rounding": "nearest"})


def test_plain_quantize_codes_and_scale():
    x = torch.randn(40, 24, generator=torch.Generator().manual_seed(0))
    a = ops.HQArgs(4, ops.ScaleMode.TENSOR, True, 7)
    q, s = ops.plain_quantize(x, a, ops.DEFAULT)
    assert q.dtype == torch.int8 and q.shape == x.shape and s.shape == (1, 1)
    assert int(q.abs().max()) == 7
    assert float(s) == pytest.approx(float(x.abs().max()) / 7, rel=1e-6)
    # stochastic rounding: within one step of x, never further
    assert ((q.float() * s - x).abs() <= s * (1 + 1e-6)).all()


def test_plain_quantize_is_unbiased():
    """Mean of N = 400 draws against x, per element: each draw's error is at most one step s
    (variance <= s^2 / 4), so the mean's sd is <= s / (2 sqrt(N)) = s / 40; 6 sd = 0.15 s, over
    96 elements a false failure has probability below 1e-7."""
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(1))
    draws = torch.stack([
        (lambda q, s: q.float() * s)(*ops.plain_quantize(
            x, ops.HQArgs(4, ops.ScaleMode.TENSOR, True, seed), ops.DEFAULT))
        for seed in range(400)])
    s = float(x.abs().max()) / 7
    assert ((draws.mean(0) - x).abs() <= 0.15 * s).all()
    assert (draws.std(0) > 0).any()  # the draws do differ


@pytest.mark.parametrize("bias", [True, False])
def test_layer_gradients_equal_the_direct_formula(bias):
    """With round-to-nearest the baseline is deterministic: g_x = Q(g_y) Q(W), g_W = Q(g_y)^T Q(x)
    with Q the per-tensor 4-bit quantizer and no transform; float32 GEMMs of exact 4-bit
    products leave a relative error of a few float32 ulps."""
    torch.manual_seed(0)
    lin = nn.Linear(24, 20, bias=bias)
    model = hot_copy(wrap(lin), _nearest())
    x = torch.randn(32, 24, requires_grad=True)
    gy = torch.randn(32, 20)
    gx, g = grads(model, x, gy)
    w = lin.weight.detach()
    want_gx = _q4_nearest(gy) @ _q4_nearest(w)
    want_gw = _q4_nearest(gy).T @ _q4_nearest(x.detach())
    assert torch.allclose(gx.double(), want_gx, rtol=1e-5, atol=1e-5 * want_gx.abs().max())
    assert torch.allclose(g["0.weight"].double(), want_gw, rtol=1e-5,
                          atol=1e-5 * want_gw.abs().max())
    if bias:
        assert torch.allclose(g["0.bias"], gy.sum(0))
    exact = gy.double() @ w.double()
    assert not torch.allclose(gx.double(), exact, atol=1e-3)  # it is quantized


def test_forward_keeps_x_not_codes():
    model = hot_copy(wrap(nn.Linear(24, 20)), hot.HOTConfig.int4())
    x = torch.randn(32, 24, requires_grad=True)
    _, saved, _ = saved_by_forward(model, x)
    assert any(t.shape == x.shape and t.dtype == x.dtype for t in saved)
    assert not any(t.dtype == torch.int8 for t in saved)


def test_stochastic_gradients_are_unbiased():
    """g_x over N = 300 seeds against g_y W: per element |mean - exact| <= 6 sd / sqrt(N), sd the
    draws' own spread (a normal tail of 6 sd over 640 elements: below 1e-6)."""
    torch.manual_seed(0)
    lin = nn.Linear(24, 20, bias=False)
    x = torch.randn(32, 24)
    gy = torch.randn(32, 20)
    draws = torch.stack([grads(hot_copy(wrap(lin), hot.HOTConfig.int4().replace(seed=s)),
                               x.requires_grad_(), gy)[0] for s in range(300)]).double()
    exact = gy.double() @ lin.weight.detach().double()
    bound = 6 * draws.std(0) / 300 ** 0.5 + 1e-6
    assert ((draws.mean(0) - exact).abs() <= bound).all()


def test_trains_a_small_cnn_through_convert():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 4))
    hot.convert(model, hot.HOTConfig.int4(), backend="reference")
    assert len(hot.hot_layers(model)) == 2
    x = torch.randn(64, 1, 8, 8)
    y = (x.mean((1, 2, 3)) > 0).long() + 2 * (x[:, :, :4].mean((1, 2, 3)) > 0).long()
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    losses = []
    for _ in range(30):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("change, field", [({"hla": {"rank": 8}}, "hla.rank"),
                                           ({"hla": {"abc": "save"}}, "hla.abc"),
                                           ({"hq": {"gy_scale": "auto"}}, "hq.gy_scale")])
def test_config_names_what_int4_needs(change, field):
    with pytest.raises(HOTConfigError, match=field.replace(".", r"\.")):
        hot.HOTConfig.int4().replace(**change)


@pytest.mark.parametrize("method", ["int4", "luq", "lbp_wht"])
def test_compiled_equals_eager(method):
    cfg = getattr(hot.HOTConfig, method)().replace(seed=5)
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    x, gy = torch.randn(2, 16, 16), torch.randn(2, 16, 8)
    me, mc = hot_copy(base, cfg), hot_copy(base, cfg)
    ge = grads(me, x, gy)[1]
    gc = grads(torch.compile(mc, backend="aot_eager", fullgraph=True), x, gy)[1]
    gc = {k.removeprefix("_orig_mod."): v for k, v in gc.items()}
    assert ge.keys() == gc.keys()
    for k in ge:
        assert torch.equal(ge[k], gc[k]), k


def _luq(x, stochastic, seed=0, mode=ops.ScaleMode.TENSOR):
    return ops.luq_quantize(x, ops.HQArgs(4, mode, stochastic, seed), ops.DEFAULT)


def test_luq_levels_are_powers_of_two_of_the_absmax():
    x = torch.tensor([[64.0, 0.3, -1.5, 3.0, 0.0, -64.0, 40.0, 0.7]]) / 8
    q, s = _luq(x, stochastic=False)
    assert float(s) == 1 / 8  # absmax / 2^6
    assert q.tolist() == [[64, 0, -1, 2, 0, -64, 32, 1]]  # nearer level; ties go down
    q, _ = _luq(torch.randn(64, 33, generator=torch.Generator().manual_seed(0)), True, seed=3)
    assert set(q.abs().unique().tolist()) <= {0, 1, 2, 4, 8, 16, 32, 64}
    qr, sr = _luq(torch.randn(5, 16), True, mode=ops.ScaleMode.ROW)
    assert sr.shape == (5, 1) and (qr.abs().amax(1) == 64).all()


def test_luq_is_unbiased():
    """Mean of N = 400 draws against x per element. A draw lands on one of the two levels around
    |x| / e, at most 2^5 e apart below the top: sd <= 16 e, the mean's sd <= 16 e / 20 = 0.8 e; a
    bound of 6 of those (4.8 e) fails by chance with probability below 1e-7 over 48 elements,
    while dropping the underflow's or the rounding's probability shifts means by up to
    e / 2 ... 2^5 e / 2 on the elements placed there."""
    top = 64
    v = torch.tensor([0.2, 0.5, 0.9, 1.3, 2.6, 5.0, 11.0, 23.0, 47.0, 63.0, 64.0, 33.0])
    x = torch.cat([v, -v, v / 2, -v / 3]).reshape(4, 12)
    e = float(x.abs().max()) / top
    draws = torch.stack([(lambda q, s: q.float() * s)(*_luq(x, True, seed=i))
                         for i in range(400)])
    assert ((draws.mean(0) - x).abs() <= 4.8 * e).all()
    small = x.abs() < e  # stochastic underflow: mean |x|, not 0
    assert (draws.mean(0)[small].abs() > 0).all()


def test_luq_layer_differs_from_int4_only_in_g_y():
    """Same seeds: LUQ's g_x uses LUQ(g_y), INT4's the plain 4-bit g_y; W is quantized alike."""
    torch.manual_seed(0)
    lin = nn.Linear(24, 20, bias=False)
    x, gy = torch.randn(32, 24, requires_grad=True), torch.randn(32, 20)
    nearest = {"hq": {"gy_rounding": "nearest", "w_rounding": "nearest"},
               "hla": {"rounding": "nearest"}}
    g4 = grads(hot_copy(wrap(lin), hot.HOTConfig.int4().replace(**nearest)), x, gy)
    gl = grads(hot_copy(wrap(lin), hot.HOTConfig.luq().replace(**nearest)), x, gy)
    qw = _q4_nearest(lin.weight.detach())
    q, s = _luq(gy, stochastic=False)
    want = (q.double() * s.double()) @ qw
    assert torch.allclose(gl[0].double(), want, rtol=1e-5, atol=1e-5 * want.abs().max())
    assert not torch.allclose(gl[0], g4[0])


@pytest.mark.parametrize("rank", [4, 8, 16])
@pytest.mark.parametrize("abc", ["save", "recompute"])
def test_lbp_wht_is_the_projection_on_both_paths(rank, abc):
    """g_x = P g_y W and g_W = g_y^T P x with P the LP_L1 projection on each block of 16 tokens
    (40 tokens: the last block zero-padded); exact at rank 16. float32 transforms of sums of
    at most 16 + 20 terms: 1e-5 relative is 100 ulps."""
    torch.manual_seed(0)
    lin = nn.Linear(24, 20)
    cfg = hot.HOTConfig.lbp_wht(rank).replace(hla={"abc": abc})
    x, gy = torch.randn(40, 24, requires_grad=True), torch.randn(40, 20)
    gx, g = grads(hot_copy(wrap(lin), cfg), x, gy)
    p = projector(40, rank, "lp_l1")
    w = lin.weight.detach().double()
    want_gx = p @ gy.double() @ w
    want_gw = gy.double().T @ p @ x.detach().double()
    assert torch.allclose(gx.double(), want_gx, atol=1e-5 * want_gx.abs().max())
    assert torch.allclose(g["0.weight"].double(), want_gw, atol=1e-5 * want_gw.abs().max())
    assert torch.allclose(g["0.bias"], gy.sum(0))
    exact = gy.double() @ w
    assert torch.allclose(gx.double(), exact, atol=1e-4) == (rank == 16)


def test_lbp_wht_config_refuses_quantization():
    with pytest.raises(HOTConfigError, match=r"hq\.bits"):
        hot.HOTConfig.lbp_wht().replace(hq={"bits": 4})
