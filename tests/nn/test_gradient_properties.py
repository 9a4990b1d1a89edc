"""Every method's gradients against their definitions, over shapes (1 and non-multiples of 16
included), dtypes (float32, bfloat16, float64) and layer types (hypothesis, reference backend).

Definitions (float64, from the layer's own inputs; P = (I (x) T_r)^T (I (x) T_r) the HLA
projector on the tokens, an orthogonal projector, P = I at rank 16 or without HLA):
    g_x = g_y W          (LBP-WHT: (P g_y) W)         convolutions: folded, as autograd's
    g_W = (P g_y)^T x    (int4, LUQ, exact: P = I)
    g_b = sum of g_y over the tokens
Each gradient is a product A B^T of two operands; a quantized method computes Q(A') Q(B')^T
with A' = A U, B' = B U, U orthogonal (the Hadamard / Walsh block transform, or none), so with
E = Q(A') - A':
    |Q(A') Q(B')^T - A B^T|_F <= |E_A|_F |B|_F + |A|_F |E_B|_F + |E_A|_F |E_B|_F.
Rounding to a grid of step s moves an entry by less than s (stochastic) or s/2 (nearest), and
s <= max|A'| / qmax for per-row and per-tensor scales alike, so |E_A|_F < sqrt(n') max|A'| /
qmax over the n' entries of A'. An entry of a 16-block transform with entries +-1/4 is at most
4 max|A|; of an untransformed operand, max|A|. LUQ rounds between neighbouring powers of two
or, below its smallest level s = max|A| / 64, between 0 and s: each entry moves by at most
|a| + s, so |E_A|_F <= |A|_F + sqrt(n) s. Fold sums at most kh*kw patch entries per pixel:
|fold(E)|_F <= sqrt(kh kw) |E|_F. On top, float rounding of a K-term product and the block
transforms: (K + 64) u |A|_F |B|_F, u the unit roundoff of the layer's dtype (float32's where
the codes and scales are formed in it). HOTConfig.exact() and LBP-WHT quantize nothing, so
only this float term remains: a tight bound. An integer product with uninitialised values
(a one-column contraction: one token, a one-output head, HLA rank 1 on <= 16 tokens) misses
these bounds by orders of magnitude; so does any gradient of the wrong definition.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import example, given, settings
from hypothesis import strategies as st

import hot
from hot.common.quant import qmax
from hot_testing import hot_copy, pad16, projector, wrap

METHODS = {
    # the bounds are of the paper's mechanics: 4-bit HQ and the fixed low-pass projection
    "hot": hot.HOTConfig.paper(),
    "hot_rank1": hot.HOTConfig.paper().replace(hla={"rank": 1}),
    "exact": hot.HOTConfig.exact(),
    "int4": hot.HOTConfig.int4(),
    "luq": hot.HOTConfig.luq(),
    "lbp_wht": hot.HOTConfig.lbp_wht(),
    "hlq": hot.HOTConfig.hlq(),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
UNIT = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float64: 2.0**-53}


def _operand_error(kind: str, bits: int, a: torch.Tensor, n_transformed: int) -> float:
    """A bound on |Q(A') - A'|_F (module docstring); ``a`` the untransformed operand."""
    if kind == "none" or not bits:
        return 0.0
    amax = float(a.abs().max()) if a.numel() else 0.0
    if kind == "luq":
        return float(a.norm()) + math.sqrt(a.numel()) * amax / 64
    grow = 4.0 if kind == "transform" else 1.0
    return math.sqrt(n_transformed) * grow * amax / qmax(bits)


def _kinds(cfg: hot.HOTConfig) -> tuple[str, str, str, str]:
    """The quantizer kinds of (g_y, W) on the g_x path and (g_y, x) on the g_W path."""
    if cfg.method in ("int4", "luq"):
        gy = "luq" if cfg.method == "luq" else "plain"
        return gy, "plain", gy, "plain"
    if cfg.method == "lbp_wht":
        return ("none",) * 4
    return ("transform",) * 4


def _product_bound(a, b, ea, eb, k, u, fold=1.0) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return fold * (ea * nb + na * eb + ea * eb + (k + 64) * u * na * nb)


def _check(name, got, want, bound):
    assert got is not None and torch.isfinite(got).all(), f"{name}: not finite"
    err = float((got.double() - want).norm())
    assert err <= bound, f"{name}: |error| {err:.3e} exceeds the bound {bound:.3e}"


def _run(plain: nn.Module, method: str, dtype: torch.dtype, x: torch.Tensor, rows, patches_of):
    """One backward of the HOT copy of ``plain`` against a random g_y; each gradient checked
    against its definition. ``rows(t)``: a layer output as (tokens, channels) rows;
    ``patches_of(x)``: the input as the rows the weight multiplies."""
    cfg = METHODS[method]
    plain = plain.to(dtype)
    model = hot_copy(wrap(plain), cfg)
    x = x.to(dtype).requires_grad_()
    y = model(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    layer = model[0]

    # the definitions, in float64 from the same (rounded) values
    x64 = x.detach().double().requires_grad_()
    p64 = plain.double()
    y64 = p64(x64)
    gy2 = rows(gy.double())
    tokens, out_c = gy2.shape
    hla_rank = 16 if cfg.method in ("int4", "luq") else cfg.hla.rank
    proj = projector(tokens, hla_rank, cfg.hla.selection)
    pgy = (proj @ gy2)
    from_rows = lambda r: r.reshape(*gy.shape[:1], *y.shape[2:], out_c).movedim(-1, 1) \
        if y.dim() == 4 else r.reshape(y.shape)  # noqa: E731
    gx_src = pgy if cfg.method == "lbp_wht" else gy2
    gx_def, = torch.autograd.grad(y64, x64, from_rows(gx_src), retain_graph=True)
    gw_def = torch.autograd.grad(y64, p64.weight, from_rows(pgy), retain_graph=True)[0]
    gb_def = gy2.sum(0)

    u = max(UNIT[dtype], UNIT[torch.float32]) if cfg.hq.bits or cfg.hla.bits else UNIT[dtype]
    k_gy, k_w, k_gyw, k_x = _kinds(cfg)
    w2 = p64.weight.detach().reshape(out_c, -1)
    xr = patches_of(x64.detach())
    kk = w2.shape[1] // (x.shape[1] if x.dim() == 4 else w2.shape[1])
    lr = pad16(tokens) // 16 * (cfg.hla.rank if k_x == "transform" else 16)
    n_gx = (tokens * pad16(out_c), xr.shape[1] * pad16(out_c)) if k_gy == "transform" \
        else (gy2.numel(), w2.numel())
    n_gw = (out_c * lr, xr.shape[1] * lr) if k_x == "transform" else (gy2.numel(), xr.numel())
    gx_bits, gw_bits = cfg.hq.bits or 0, cfg.hla.bits or 0
    gx_bound = _product_bound(gy2, w2, _operand_error(k_gy, gx_bits, gy2, n_gx[0]),
                              _operand_error(k_w, gx_bits, w2, n_gx[1]), out_c * kk, u,
                              math.sqrt(kk))
    # g_W's operands: the projected g_y (|P g_y| <= |g_y|) and x
    gw_bound = _product_bound(gy2, xr, _operand_error(k_gyw, gw_bits, gy2, n_gw[0]),
                              _operand_error(k_x, gw_bits, xr, n_gw[1]), tokens, u)
    _check("g_x", x.grad, gx_def, gx_bound)
    _check("g_W", layer.weight.grad, gw_def, gw_bound)
    _check("g_b", layer.bias.grad, gb_def,
           (tokens + 1) * UNIT[dtype] * float(gy2.abs().sum(0).norm()))


METHOD = st.sampled_from(sorted(METHODS))
DTYPE = st.sampled_from(sorted(DTYPES))


@settings(max_examples=30)
@given(method=METHOD, dtype=DTYPE, tokens=st.integers(1, 40), in_f=st.integers(1, 40),
       out_f=st.integers(1, 40), seed=st.integers(0, 2**16))
# the one-column contractions: one token (int4 / LUQ g_W), a one-output head under int4 (g_x
# over O = 1), HLA rank 1 on 16 tokens or fewer (g_W over one Walsh coefficient)
@example(method="int4", dtype="float32", tokens=1, in_f=8, out_f=8, seed=0)
@example(method="luq", dtype="float32", tokens=1, in_f=8, out_f=8, seed=0)
@example(method="int4", dtype="float32", tokens=8, in_f=8, out_f=1, seed=0)
@example(method="hot_rank1", dtype="float32", tokens=16, in_f=8, out_f=8, seed=0)
def test_linear_gradients_within_their_definition(method, dtype, tokens, in_f, out_f, seed):
    torch.manual_seed(seed)
    lin = nn.Linear(in_f, out_f)
    x = torch.randn(tokens, in_f)
    _run(lin, method, DTYPES[dtype], x, lambda t: t, lambda t: t)


@settings(max_examples=20)
@given(method=METHOD, dtype=DTYPE, batch=st.integers(1, 2), cin=st.integers(1, 3),
       cout=st.integers(1, 5), size=st.integers(1, 6), k=st.integers(1, 3),
       stride=st.integers(1, 2), pad=st.integers(0, 1), seed=st.integers(0, 2**16))
@example(method="int4", dtype="float32", batch=1, cin=2, cout=3, size=3, k=3, stride=1, pad=0,
         seed=0)
@example(method="hot_rank1", dtype="float32", batch=1, cin=2, cout=4, size=4, k=1, stride=1,
         pad=0, seed=0)
def test_conv2d_gradients_within_their_definition(method, dtype, batch, cin, cout, size, k,
                                                   stride, pad, seed):
    if size + 2 * pad < k:
        return  # no output position (nn.Conv2d refuses it too)
    torch.manual_seed(seed)
    conv = nn.Conv2d(cin, cout, k, stride=stride, padding=pad)
    x = torch.randn(batch, cin, size, size)

    def unfold(t):
        p = F.unfold(t, k, padding=pad, stride=stride)
        return p.transpose(1, 2).reshape(-1, p.shape[1])

    _run(conv, method, DTYPES[dtype], x, lambda t: t.movedim(1, -1).reshape(-1, t.shape[1]),
         unfold)
