"""What the HOT gradients estimate: unbiasedness of the quantized paths, exactness of the
low-rank projection without quantization, and the two token blockings of HLA.

Moments of a product of independently stochastically rounded operands. Both paths compute
G = A_hat B_hat^T where A_hat = SR(A) (per-row scale s_a) and B_hat = SR(B) (per-row scale s_b)
are rounded independently element by element (distinct positions / seeds of the stream), with
E[A_hat] = A, Var[A_hat_lo] = s_a^2 f (1 - f) =: Va_lo (f = frac(A_lo / s_a)), same for B. Then
E[G] = A B^T, and with a = A_hat - A, b = B_hat - B, G - A B^T = a B^T + A b^T + a b^T, whose
three parts are uncorrelated, so
    Cov(G_li, G_l'i') = [l=l'] sum_o Va_lo B_io B_i'o + [i=i'] sum_o A_lo A_l'o Vb_io
                        + [l=l', i=i'] sum_o Va_lo Vb_io.
The mean of N independent draws has covariance C / N and, by the CLT, is close to Gaussian.
"""

import contextlib
import math

import pytest
import torch
import torch.nn as nn

import hot
from hot.common import quant
from hot.reference.ops import hla_transform, hq_transform
from hot_testing import gamma, hot_copy, ones_blocks, pad16, projector, wrap

U32 = 2.0**-24
Z = 5.0  # sigmas allowed per element; over <= 4096 elements the Gaussian union bound is < 3e-3


def _sr_moments(t: torch.Tensor, bits: int):
    """(A in float64, Var of its stochastic rounding) for the float32 values the code rounds."""
    s = quant.absmax_scale(t, bits, "row")
    v = t / s
    f = (v - torch.floor(v)).double()
    return t.double(), s.double() ** 2 * f * (1 - f), s.double()


def _covariance(a, va, b, vb):
    """Full covariance of G = A_hat B_hat^T flattened row-major, from the formula above."""
    n_l, n_i = a.shape[0], b.shape[0]
    c = torch.zeros(n_l, n_i, n_l, n_i, dtype=torch.float64)
    il, ii = torch.arange(n_l), torch.arange(n_i)
    c[il, :, il, :] += torch.einsum("lo,io,jo->lij", va, b, b)
    c[:, ii, :, ii] += torch.einsum("lo,mo,io->ilm", a, a, vb)
    c[il[:, None], ii[None, :], il[:, None], ii[None, :]] += va @ vb.T
    return c.reshape(n_l * n_i, n_l * n_i)


def _f32_slack(a, sa, b, sb, dense_bound):
    """Deterministic float32 effects the unbiasedness argument ignores: the transforms are
    computed in float32 (16-term sums: <= gamma_16(u32) relative, on both operands), and each
    draw's dequantized output is rounded (<= 3 u32 of sum |A_hat| |B_hat|)."""
    g16 = 16 * U32 / (1 - 16 * U32)
    return 3 * g16 * dense_bound + 3 * U32 * ((a.abs() + sa) @ (b.abs() + sb).T)


@pytest.mark.parametrize("stream", ["default", "hash"])
def test_hq_gx_is_unbiased_and_its_error_shrinks_like_one_over_sqrt_draws(stream):
    """Paper g_x path (4-bit, both operands stochastically rounded, per-token g_y scale) over
    independent draws (a different torch seed per backward), with the reference's default
    random stream and with the kernels' hash stream."""
    ctx = quant.hash_rng() if stream == "hash" else contextlib.nullcontext()
    torch.manual_seed(0)
    n_tok, i_f, o_f = 64, 64, 40  # O = 40 is zero-padded to 48
    lin = nn.Linear(i_f, o_f, bias=False)
    lin.weight.requires_grad_(False)  # only the g_x path runs
    cfg = hot.HOTConfig(hq=hot.HQConfig(bits=4, gy_scale="token"))
    model = hot_copy(wrap(lin), cfg)
    x = torch.randn(n_tok, i_f, requires_grad=True)
    gy = torch.randn(n_tok, o_f)
    w = lin.weight.detach()
    exact = gy.double() @ w.double()

    def draw(i):
        # The CPU generator only: torch.manual_seed also queues CUDA/XPU/MTIA seeding with a
        # captured stack trace (~2 ms per call here). HOT draws its seeds from this generator.
        torch.random.default_generator.manual_seed(10_000 + i)
        (gx,) = torch.autograd.grad(model(x), x, gy)
        return gx.double()

    n = 60  # the RMS statistic's spread rho depends on the elements, not on N
    with ctx:
        first = torch.stack([draw(i) for i in range(n)]).mean(0)
        rest = torch.stack([draw(i) for i in range(n, 5 * n)]).mean(0)  # 4N more, disjoint

    a, va, sa = _sr_moments(hq_transform(gy), 4)
    b, vb, sb = _sr_moments(hq_transform(w.t()), 4)
    c = _covariance(a, va, b, vb)
    var = torch.diagonal(c).reshape(n_tok, i_f)
    slack = _f32_slack(a, sa, b, sb, gy.double().abs() @ ones_blocks(o_f) @ w.double().abs())

    both = (first + 4 * rest) / 5  # all 5N draws
    z = (both - exact).abs() - slack
    assert (z <= Z * (var / (5 * n)).sqrt()).all(), "mean of 5N draws is biased"

    # RMS^2 of the mean error: E = tr(C) / (N n_el), relative sd rho = sqrt(2 tr(C^2)) / tr(C)
    # (Gaussian quadratic form); allow 5 rho. Here rho ~ 0.03.
    n_el = n_tok * i_f
    tr = torch.trace(c).item()
    rho = math.sqrt(2 * (c * c).sum().item()) / tr
    assert rho < 0.05  # the test is only meaningful when the statistic is concentrated
    rms2_n = ((first - exact) ** 2).mean().item()
    rms2_4n = ((rest - exact) ** 2).mean().item()
    for rms2, draws in ((rms2_n, n), (rms2_4n, 4 * n)):
        expect = tr / (draws * n_el)
        assert abs(rms2 / expect - 1) <= Z * rho, (draws, rms2 / expect)
    ratio = math.sqrt(rms2_n / rms2_4n)
    lo, hi = 2 * math.sqrt((1 - Z * rho) / (1 + Z * rho)), 2 * math.sqrt((1 + Z * rho) / (1 - Z * rho))
    assert lo <= ratio <= hi, ratio
    print(f"rho={rho:.4f} rms2/expect: N {rms2_n * n * n_el / tr:.3f}, 4N {rms2_4n * 4 * n * n_el / tr:.3f}; "
          f"RMS(N)/RMS(4N)={ratio:.3f} allowed [{lo:.2f}, {hi:.2f}]")


def test_hla_gw_with_int8_is_unbiased_for_the_projected_gradient():
    """Paper g_W path (rank 8, INT8, per-channel scales, ABC copy rounded in forward): the mean
    over draws estimates g_y^T P x, not g_y^T x."""
    torch.manual_seed(1)
    n_tok, i_f, o_f = 40, 12, 20  # L = 40 is padded to 48
    lin = nn.Linear(i_f, o_f, bias=False)
    model = hot_copy(wrap(lin), hot.HOTConfig.paper())
    x = torch.randn(n_tok, i_f)  # no g_x path
    gy = torch.randn(n_tok, o_f)
    target = gy.double().T @ projector(n_tok, 8) @ x.double()

    n = 300
    acc = torch.zeros(o_f, i_f, dtype=torch.float64)
    for i in range(n):
        torch.random.default_generator.manual_seed(20_000 + i)
        model.zero_grad(set_to_none=True)
        model(x).backward(gy)
        acc += model[0].weight.grad.double()
    mean = acc / n

    a, va, sa = _sr_moments(hla_transform(gy, 8, "lowpass"), 8)
    b, vb, sb = _sr_moments(hla_transform(x, 8, "lowpass"), 8)
    var = torch.einsum("lo,io->li", va, b**2) + torch.einsum("lo,io->li", a**2, vb) + va @ vb.T
    slack = _f32_slack(a, sa, b, sb, gy.double().abs().T @ ones_blocks(n_tok) @ x.double().abs())
    assert ((mean - target).abs() - slack <= Z * (var / n).sqrt()).all()
    # ... and it is far from the unprojected gradient (the low-rank bias is real).
    full = gy.double().T @ x.double()
    assert ((mean - full).abs() > Z * (var / n).sqrt() + slack).float().mean() > 0.5


def _fp64_close(got, want, bound):
    assert got.shape == want.shape
    assert ((got - want).abs() <= bound).all(), (got - want).abs().max()


@pytest.mark.parametrize("rank", [1, 2, 4, 8])
@pytest.mark.parametrize("selection", ["lowpass", "lp_l1"])
def test_low_rank_without_quantization_is_the_projected_gradient(rank, selection):
    """hla bits=None, hq bits=None: g_W == g_y^T P x exactly (float64 bound as in
    test_exact_vs_autograd: gamma_{L16+32} |g_y|^T J |x|), and g_x stays exact."""
    torch.manual_seed(rank)
    cfg = hot.HOTConfig(hq=hot.HQConfig(bits=None),
                        hla=hot.HLAConfig(rank=rank, selection=selection, bits=None))
    lin = nn.Linear(10, 7).double()
    model = hot_copy(wrap(lin), cfg)
    x = torch.randn(3, 11, 10, dtype=torch.float64, requires_grad=True)  # 33 tokens -> 48
    gy = torch.randn(3, 11, 7, dtype=torch.float64)
    model(x).backward(gy)
    x2, gy2 = x.detach().reshape(-1, 10), gy.reshape(-1, 7)
    bound = 2 * gamma(pad16(33) + 32) * (gy2.abs().T @ ones_blocks(33) @ x2.abs())
    _fp64_close(model[0].weight.grad, gy2.T @ projector(33, rank, selection) @ x2, bound)
    gx_bound = 2 * gamma(16 + 32) * (gy2.abs() @ ones_blocks(7) @ lin.weight.detach().abs())
    _fp64_close(x.grad.reshape(-1, 10), gy2 @ lin.weight.detach(), gx_bound)
    # The bias gradient is never approximated.
    assert torch.equal(model[0].bias.grad, gy2.sum(0))


def test_low_rank_projection_for_conv_tokens():
    """Conv2d: the token axis is (image, output position); same projector identity."""
    torch.manual_seed(3)
    cfg = hot.HOTConfig(hq=hot.HQConfig(bits=None),
                        hla=hot.HLAConfig(rank=4, selection="lowpass", bits=None))
    conv = nn.Conv2d(2, 5, 3, padding=1, bias=False).double()
    model = hot_copy(wrap(conv), cfg)
    x = torch.randn(2, 2, 5, 3, dtype=torch.float64)  # 30 tokens
    gy = torch.randn(2, 5, 5, 3, dtype=torch.float64)
    model(x).backward(gy)
    xu = torch.nn.functional.unfold(x, 3, padding=1).transpose(1, 2).reshape(30, -1)
    gy2 = gy.permute(0, 2, 3, 1).reshape(30, 5)
    bound = 2 * gamma(32 + 32) * (gy2.abs().T @ ones_blocks(30) @ xu.abs())
    _fp64_close(model[0].weight.grad.reshape(5, -1), gy2.T @ projector(30, 4) @ xu, bound)


def _sequence_wise(gy, x, rank):
    """Explicit construction of blocking='sequence': each sequence padded on its own."""
    out = 0
    for b in range(x.shape[0]):
        out = out + gy[b].T @ projector(x.shape[1], rank) @ x[b]
    return out


def test_sequence_blocking_pads_each_sequence_separately():
    torch.manual_seed(4)
    base = hot.HOTConfig(hq=hot.HQConfig(bits=None),
                         hla=hot.HLAConfig(rank=8, selection="lowpass", bits=None))
    lin = nn.Linear(6, 5, bias=False).double()
    # 19 tokens per sequence -> 32 each. An odd length matters: lowpass rank 8 is the average
    # over aligned token pairs (see test_walsh), so an even length would give the same pairs
    # under both blockings.
    x = torch.randn(3, 19, 6, dtype=torch.float64)
    gy = torch.randn(3, 19, 5, dtype=torch.float64)
    seq_model = hot_copy(wrap(lin), base.replace(hla={"blocking": "sequence"}))
    flat_model = hot_copy(wrap(lin), base)
    seq_model(x).backward(gy)
    flat_model(x).backward(gy)
    x2, gy2 = x.reshape(-1, 6), gy.reshape(-1, 5)
    bound = 2 * gamma(32 * 3 + 32) * (gy2.abs().T @ ones_blocks(57) @ x2.abs())
    _fp64_close(seq_model[0].weight.grad, _sequence_wise(gy, x, 8), bound)
    _fp64_close(flat_model[0].weight.grad, gy2.T @ projector(57, 8) @ x2, bound)
    # The two blockings really differ here (flat blocks straddle sequence boundaries).
    assert (seq_model[0].weight.grad - flat_model[0].weight.grad).abs().max() > 1e-3


def test_sequence_blocking_for_conv_uses_one_sequence_per_image():
    torch.manual_seed(5)
    cfg = hot.HOTConfig(hq=hot.HQConfig(bits=None),
                        hla=hot.HLAConfig(rank=2, selection="lowpass", bits=None,
                                          blocking="sequence"))
    conv = nn.Conv2d(2, 3, (1, 2), bias=False).double()
    model = hot_copy(wrap(conv), cfg)
    x = torch.randn(2, 2, 4, 6, dtype=torch.float64)  # 4 x 5 = 20 positions per image
    gy = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    model(x).backward(gy)
    xu = torch.nn.functional.unfold(x, (1, 2)).transpose(1, 2)  # (2, 20, 4)
    gys = gy.permute(0, 2, 3, 1).reshape(2, 20, 3)
    want = _sequence_wise(gys, xu, 2)
    bound = 2 * gamma(64 + 32) * (gys.reshape(40, 3).abs().T @ ones_blocks(40) @ xu.reshape(40, 4).abs())
    _fp64_close(model[0].weight.grad.reshape(3, -1), want, bound)


def test_lp_l1_paper_setting_runs_end_to_end():
    torch.manual_seed(6)
    cfg = hot.HOTConfig(hla=hot.HLAConfig(selection="lp_l1"))
    model = hot_copy(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)), cfg)
    x = torch.randn(8, 5, 16, requires_grad=True)
    model(x).square().mean().backward()
    for p in [x.grad, *[p.grad for p in model.parameters()]]:
        assert p is not None and torch.isfinite(p).all() and p.abs().sum() > 0
    assert all(m.hot_config.hla.selection == "lp_l1" for _, m in hot.hot_layers(model))
