"""HOTConfig.exact() gives autograd's gradients (float64, random shapes, hypothesis).

With bits=None and rank 16 the HOT backward still runs both orthonormal block transforms, so it
differs from autograd only by float64 rounding. Bound (Higham, Accuracy and Stability, 3.5):
a computed product of matrices with a chain of n accumulations differs from the exact one by at
most gamma_n |A1| |A2| ... elementwise. For g_x = (g_y Hb)(Hb^T W):
    |HOT - exact| <= gamma_{O16 + 32} |g_y| |Hb| |Hb^T| |W| = gamma_{O16+32} |g_y| J |W|
(J: 16 x 16 blocks of ones, since |Hb||Hb^T| has entries 16 * 1/16), and autograd's own
|fl(g_y W) - g_y W| <= gamma_O |g_y| |W| <= gamma_O |g_y| J |W|. The test allows the sum of the
two. g_W is the same with the token axis (L16) in place of O; convolutions add the kh*kw terms
that fold sums per input pixel. A quantized (4-bit) path misses these bounds by ~10 orders of
magnitude, so they are tight enough to catch any approximation.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import hot
from hot_testing import gamma, grads, hot_copy, ones_blocks, pad16, wrap


def _assert_within(got, want, tol, what):
    assert got is not None and want is not None, what
    assert got.shape == want.shape and got.dtype == want.dtype, what
    diff = (got - want).abs()
    bad = diff > tol
    assert not bad.any(), (f"{what}: {int(bad.sum())} elements exceed the float64 bound; "
                           f"worst diff {diff[bad].max().item():.3e}")


@given(lead=st.lists(st.integers(1, 4), min_size=0, max_size=2), tokens=st.integers(1, 37),
       in_f=st.integers(1, 40), out_f=st.integers(1, 40), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_linear_exact_matches_autograd(lead, tokens, in_f, out_f, bias, seed):
    torch.manual_seed(seed)
    plain = nn.Linear(in_f, out_f, bias=bias).double()
    model = hot_copy(wrap(plain), hot.HOTConfig.exact())
    x = torch.randn(*lead, tokens, in_f, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(*lead, tokens, out_f, dtype=torch.float64)
    gx_ref, g_ref = grads(wrap(plain), x, gy)
    gx, g = grads(model, x, gy)

    w = plain.weight.detach()
    gy2, x2 = gy.reshape(-1, out_f), x.detach().reshape(-1, in_f)
    n_tok = gy2.shape[0]
    s_gx = gy2.abs() @ ones_blocks(out_f) @ w.abs()
    _assert_within(gx, gx_ref, (gamma(pad16(out_f) + 32) + gamma(out_f)) * s_gx.reshape(gx.shape),
                   "g_x")
    s_gw = gy2.abs().T @ ones_blocks(n_tok) @ x2.abs()
    _assert_within(g["0.weight"], g_ref["0.weight"],
                   (gamma(pad16(n_tok) + 32) + gamma(n_tok)) * s_gw, "g_W")
    if bias:
        _assert_within(g["0.bias"], g_ref["0.bias"], 2 * gamma(n_tok) * gy2.abs().sum(0), "g_b")
    else:
        assert "0.bias" not in g


def _out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


@st.composite
def conv_geometry(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    ph, pw = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    h = draw(st.integers(max(1, dh * (kh - 1) + 1 - 2 * ph), 9))
    w = draw(st.integers(max(1, dw * (kw - 1) + 1 - 2 * pw), 9))
    return (kh, kw), (sh, sw), (ph, pw), (dh, dw), (h, w)


@given(geom=conv_geometry(), batch=st.integers(1, 2), c_in=st.integers(1, 4),
       c_out=st.integers(1, 20), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_conv2d_exact_matches_autograd(geom, batch, c_in, c_out, bias, seed):
    (kh, kw), stride, padding, dilation, (h, w) = geom
    torch.manual_seed(seed)
    plain = nn.Conv2d(c_in, c_out, (kh, kw), stride, padding, dilation, bias=bias).double()
    model = hot_copy(wrap(plain), hot.HOTConfig.exact())
    x = torch.randn(batch, c_in, h, w, dtype=torch.float64, requires_grad=True)
    ho = _out_size(h, kh, stride[0], padding[0], dilation[0])
    wo = _out_size(w, kw, stride[1], padding[1], dilation[1])
    gy = torch.randn(batch, c_out, ho, wo, dtype=torch.float64)
    gx_ref, g_ref = grads(wrap(plain), x, gy)
    gx, g = grads(model, x, gy)

    kk = kh * kw
    w2 = plain.weight.detach().reshape(c_out, -1)
    gy2 = gy.permute(0, 2, 3, 1).reshape(-1, c_out)
    n_tok = gy2.shape[0]
    cols = (gy2.abs() @ ones_blocks(c_out) @ w2.abs()).reshape(batch, ho * wo, -1).transpose(1, 2)
    s_gx = F.fold(cols, (h, w), (kh, kw), dilation, padding, stride)
    _assert_within(gx, gx_ref, (gamma(pad16(c_out) + 32 + kk) + gamma(c_out * kk)) * s_gx, "g_x")
    xu = F.unfold(x.detach().abs(), (kh, kw), dilation, padding, stride)
    xu2 = xu.transpose(1, 2).reshape(-1, xu.shape[1])
    s_gw = (gy2.abs().T @ ones_blocks(n_tok) @ xu2).reshape(plain.weight.shape)
    _assert_within(g["0.weight"], g_ref["0.weight"],
                   (gamma(pad16(n_tok) + 32) + gamma(n_tok)) * s_gw, "g_W")
    if bias:
        _assert_within(g["0.bias"], g_ref["0.bias"], 2 * gamma(n_tok) * gy2.abs().sum(0), "g_b")


def test_bound_is_tight_enough_to_catch_quantization():
    """The same bound fails for the paper setting (4-bit g_x): the check can fail."""
    torch.manual_seed(0)
    plain = nn.Linear(24, 20).double()
    model = hot_copy(wrap(plain), hot.HOTConfig())
    x = torch.randn(32, 24, dtype=torch.float64, requires_grad=True)
    gy = torch.randn(32, 20, dtype=torch.float64)
    gx_ref, _ = grads(wrap(plain), x, gy)
    gx, _ = grads(model, x, gy)
    tol = (gamma(32 + 32) + gamma(20)) * (gy.abs() @ ones_blocks(20) @ plain.weight.detach().abs())
    assert ((gx - gx_ref).abs() > tol).float().mean() > 0.9


@pytest.mark.parametrize("padding,kernel,dilation", [("same", (3, 5), 1), ("same", 3, 2),
                                                     ("valid", (2, 3), 1)])
def test_conv2d_string_padding_exact(padding, kernel, dilation):
    torch.manual_seed(0)
    plain = nn.Conv2d(3, 5, kernel, padding=padding, dilation=dilation).double()
    model = hot_copy(wrap(plain), hot.HOTConfig.exact())
    x = torch.randn(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    y_ref = plain(x)
    gy = torch.randn_like(y_ref)
    gx_ref, g_ref = grads(wrap(plain), x, gy)
    gx, g = grads(model, x, gy)
    # Same Higham bound as above, in its scalar form: every element of g_x sums at most
    # O * kh * kw products plus the transforms, each entry bounded by max|g_y| max|W| * 16.
    kk = plain.weight.shape[-1] * plain.weight.shape[-2]
    scale = 16 * kk * pad16(5) * gy.abs().max() * plain.weight.abs().max()
    _assert_within(gx, gx_ref, 2 * gamma(pad16(5) + 32 + kk) * scale, "g_x")
    n_tok = gy.shape[0] * gy.shape[2] * gy.shape[3]
    scale_w = 16 * pad16(n_tok) * gy.abs().max() * x.detach().abs().max()
    _assert_within(g["0.weight"], g_ref["0.weight"], 2 * gamma(pad16(n_tok) + 32) * scale_w, "g_W")


def test_even_kernel_same_padding_stays_standard_and_is_reported(caplog):
    model = nn.Sequential(nn.Conv2d(3, 5, 2, padding="same"))
    with caplog.at_level("INFO", logger="hot"):
        hot.convert(model, backend="reference")
    assert any("same" in r.getMessage() and "'0'" in r.getMessage() for r in caplog.records)
    assert type(model[0]) is nn.Conv2d
