"""Quantizer math (hot.common.quant): levels, scales, rounding, and both random streams.

Stochastic-rounding bounds. For v with fractional part f, one draw q = floor(v + u) is v - f or
v - f + 1, so E[q] = v (up to the grid of u: U_GRID_BIAS) and Var[q] = f (1 - f) <= 1/4. The mean of n
independent draws therefore has sd <= 1 / (2 sqrt n); we allow 5 sd (two-sided Gaussian tail
5.7e-7 per element, so < 1e-4 over the few hundred elements tested; seeds are fixed anyway).
"""

import contextlib
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import torch

from hot.common import quant

STREAMS = ("default", "hash")
# |E[floor(v+u)] - v| for u on each stream's grid (quant docstring): the default CPU stream's
# 16-bit midpoints, the hash stream's k / 2^24.
U_GRID_BIAS = {"default": 2.0**-17, "hash": 2.0**-24}


def _stream(name):
    return quant.hash_rng() if name == "hash" else contextlib.nullcontext()


def _test_values(bits, m=96, seed=1):
    """Scaled values v in [-qmax, qmax]: random fractions plus the edge cases (exact integers,
    the end points, fractions next to 0 and 1)."""
    qm = quant.qmax(bits)
    g = torch.Generator().manual_seed(seed)
    v = (torch.rand(m, generator=g, dtype=torch.float64) * 2 - 1) * qm
    edges = torch.tensor([-qm, qm, 0.0, 1.0, -1.0, 0.5, -0.5, 1e-3, 1 - 1e-3, qm - 0.25,
                          -qm + 0.25], dtype=torch.float64)
    return torch.cat([edges, v]).to(torch.float32)


# --- the hash stream is the documented function (so GPU kernels can reproduce it) -------------

def _mix32_spec(x):
    # lowbias32 written from the quant module docstring, independently of quant.mix32.
    m = 0xFFFFFFFF
    x &= m
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    x ^= x >> 16
    return x


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 1])
def test_hash_uniform_matches_its_documented_formula(seed):
    shape = (3, 37)
    u = quant.hash_uniform(seed, shape)
    key = _mix32_spec((seed & 0xFFFFFFFF) ^ 0x9E3779B9)
    flat = u.flatten().tolist()
    for i in range(len(flat)):
        assert flat[i] == (_mix32_spec(i ^ key) >> 8) / 2.0**24
    with quant.hash_rng():
        assert quant.rng_mode() == "hash"
        assert torch.equal(quant.uniform(seed, shape), u)
    assert quant.rng_mode() == "default"


def _derive_seed_spec(*parts):
    # derive_seed as its docstring's chain: h = mix32(h ^ mix32(p)) from 0x2545F491, 31 bits kept.
    h = 0x2545F491
    for p in parts:
        h = _mix32_spec(h ^ _mix32_spec(p & 0xFFFFFFFF))
    return h & 0x7FFFFFFF


@given(st.lists(st.integers(0, 2**40), max_size=4), st.lists(st.integers(0, 2**40), max_size=3))
def test_derive_seed_and_its_prefix_form_agree_with_the_chain(a, b):
    assert quant.derive_seed(*a, *b) == _derive_seed_spec(*a, *b)
    assert quant.derive_seed_from(quant.seed_prefix(*a), *b) == _derive_seed_spec(*a, *b)


def test_mix32_tensor_equals_scalar_version():
    x = torch.tensor([0, 1, 2, 0x9E3779B9, 0xFFFFFFFF, 123456789], dtype=torch.int64)
    assert quant.mix32_tensor(x).tolist() == [_mix32_spec(int(a)) for a in x]


@pytest.mark.parametrize("stream", STREAMS)
def test_uniform_is_in_unit_interval_and_seed_dependent(stream):
    with _stream(stream):
        a = quant.uniform(7, (64, 64))
        b = quant.uniform(7, (64, 64))
        c = quant.uniform(8, (64, 64))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.min() >= 0 and a.max() < 1
    # Mean of 4096 U[0,1) draws: sd = sqrt(1/12 / 4096) = 0.0045; 5 sd = 0.023.
    assert abs(a.mean().item() - 0.5) < 0.023


# --- stochastic rounding ------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("stream", STREAMS)
def test_stochastic_rounding_unbiased_and_within_one_step(bits, stream):
    v = _test_values(bits)
    n = 4000
    with _stream(stream):
        # n independent draws per element: distinct positions of one call (one seed) ...
        q = quant.round_to_levels(v.expand(n, -1), bits, True, seed=3).to(torch.float64)
        # ... and the same position across seeds.
        q_seeds = torch.stack([quant.round_to_levels(v, bits, True, seed=s)
                               for s in range(1000, 1000 + 400)]).to(torch.float64)
    v64 = v.to(torch.float64)
    for draws in (q, q_seeds):
        assert ((draws - v64).abs() < 1).all(), "a draw left the two neighbouring levels"
        assert torch.equal(draws, draws.round())
        k = draws.shape[0]
        bound = 5 / (2 * math.sqrt(k)) + U_GRID_BIAS[stream]
        err = (draws.mean(0) - v64).abs()
        assert err.max().item() <= bound, (err.max().item(), bound)
    # Exact levels never move.
    ints = v64 == v64.round()
    assert torch.equal(q[:, ints], v64[ints].expand(n, -1))
    # A systematic bias would show in the average over all n * m draws: sd <= 1/(2 sqrt(n m)).
    m = v.numel()
    assert abs((q - v64).mean().item()) <= 5 / (2 * math.sqrt(n * m)) + U_GRID_BIAS[stream]


@pytest.mark.parametrize("stream", STREAMS)
def test_stochastic_rounding_variance_is_f_one_minus_f(stream):
    """The per-element variance the bounds rely on: Var[q] = f (1 - f). q - floor(v) is
    Bernoulli(f); its squared deviation has variance t (1 - 4t) <= 1/16 with t = f (1 - f), so
    the (biased) sample variance of n = 4000 draws has sd <= 1 / (4 sqrt n) = 0.004 (plus an
    O(1/n) bias); 5 sd = 0.02."""
    v = torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9, 3.3, -2.6], dtype=torch.float32)
    n = 4000
    with _stream(stream):
        q = quant.round_to_levels(v.expand(n, -1), 8, True, seed=11).to(torch.float64)
    f = v.to(torch.float64) - v.to(torch.float64).floor()
    assert ((q.var(0, unbiased=False) - f * (1 - f)).abs() <= 0.02).all()


@pytest.mark.parametrize("bits", [4, 8])
def test_round_to_nearest_error_at_most_half_step(bits):
    v = _test_values(bits, m=500)
    q = quant.round_to_levels(v, bits, False, seed=0).to(torch.float32)
    assert ((q - v).abs() <= 0.5).all()
    # Half-way cases go to even (torch.round), symmetric in sign.
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5])
    assert quant.round_to_levels(halves, bits, False, 0).tolist() == [0, 2, 2, 0, -2, -2]


@pytest.mark.parametrize("mode", ["row", "col", "tensor"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("stochastic", [True, False])
def test_quantize_dequantize_error_bounded_by_scale(mode, bits, stochastic):
    x = torch.randn(12, 20) * torch.logspace(-3, 2, 20)  # columns of very different size
    q, s = quant.quantize(x, bits, mode, stochastic, seed=5)
    assert q.dtype == torch.int8
    assert s.shape == {"row": (12, 1), "col": (1, 20), "tensor": (1, 1)}[mode]
    qm = quant.qmax(bits)
    amax = {"row": x.abs().amax(1, keepdim=True), "col": x.abs().amax(0, keepdim=True),
            "tensor": x.abs().amax().reshape(1, 1)}[mode]
    torch.testing.assert_close(s, amax / qm, rtol=1e-6, atol=0)
    err = (q.float() * s - x).abs()
    step = s.expand_as(x)
    # Stochastic: within one step; nearest: within half a step (float32 slack of 1e-5 relative).
    limit = step * (1.0 if stochastic else 0.5) * (1 + 1e-5)
    assert (err <= limit).all()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("stochastic", [True, False])
def test_levels_are_symmetric_and_never_use_the_extra_negative_code(bits, stochastic):
    qm = quant.qmax(bits)
    assert qm == 2 ** (bits - 1) - 1
    x = torch.randn(64, 64) * 3
    x[0, 0], x[0, 1] = x.abs().max() * 1.0, -x.abs().max() * 1.0  # both end points present
    q, s = quant.quantize(x, bits, "tensor", stochastic, seed=9)
    assert q.min().item() == -qm and q.max().item() == qm
    assert q[0, 0].item() == qm and q[0, 1].item() == -qm
    if not stochastic:
        qn, sn = quant.quantize(-x, bits, "tensor", False, seed=9)
        assert torch.equal(qn, -q) and torch.equal(sn, s)


@pytest.mark.parametrize("stochastic", [True, False])
@pytest.mark.parametrize("stream", STREAMS)
def test_all_zero_group_gives_exact_zeros_and_scale_one(stochastic, stream):
    x = torch.randn(4, 8)
    x[2] = 0
    with _stream(stream):
        q, s = quant.quantize(x, 4, "row", stochastic, seed=1)
        qz, sz = quant.quantize(torch.zeros(3, 5), 8, "tensor", stochastic, seed=1)
    assert s[2].item() == 1.0 and not q[2].any()
    assert (s[[0, 1, 3]] != 1).all()
    assert sz.item() == 1.0 and not qz.any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_non_finite_input_makes_scale_and_product_non_finite(bad, mode):
    from hot.reference import ops as ref

    x = torch.randn(4, 16)
    x[1, 3] = bad
    q, s = quant.quantize(x, 4, mode, True, seed=0)
    assert q.dtype == torch.int8  # storage stays finite; the scale carries the NaN/Inf
    bad_rows = [1] if mode == "row" else [0, 1, 2, 3]
    assert not torch.isfinite(s[bad_rows if mode == "row" else 0]).any()
    if mode == "row":
        assert torch.isfinite(s[[0, 2, 3]]).all()
    deq = q.float() * s
    assert not torch.isfinite(deq[1]).all()
    # Through the integer GEMM: every output that touches a non-finite scale is non-finite.
    w = torch.randn(5, 16)
    qw, sw = quant.quantize(w, 4, "row", True, seed=1)
    out = ref.int_gemm_nt(q, qw, s, sw, torch.float32)
    assert not torch.isfinite(out[bad_rows]).any()
    if mode == "row":
        assert torch.isfinite(out[[0, 2, 3]]).all()


@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_expected_sr_error_matches_monte_carlo(mode):
    """E||x - SR(x)||^2 = sum scale^2 f (1 - f) (what LQS compares). The Monte Carlo mean over
    n = 400 seeds has standard error sd / sqrt(n), sd estimated from the 400 samples; 5 of them."""
    x = torch.randn(16, 16)
    x[3] *= 30  # an outlier token makes the two modes differ
    expect = quant.expected_sr_error(x, 4, mode).item()
    errs = []
    for seed in range(400):
        q, s = quant.quantize(x, 4, mode, True, seed=seed)
        errs.append(((q.float() * s - x) ** 2).sum().item())
    errs = torch.tensor(errs, dtype=torch.float64)
    sd_mean = errs.std().item() / math.sqrt(len(errs))
    assert abs(errs.mean().item() - expect) <= 5 * sd_mean


def _default_u_spec(seed, n):
    # The default CPU stream as the quant module docstring defines it, written independently:
    # u = (w + 1/2) / 2^16 over the 16-bit words w of PCG64's raw outputs, least significant first.
    raw = np.random.PCG64(np.random.SeedSequence([seed])).random_raw((n + 3) // 4)
    words = [(r >> (16 * j)) & 0xFFFF for r in raw.tolist() for j in range(4)]
    return [(w + 0.5) / 2.0**16 for w in words[:n]]


@pytest.mark.parametrize("seed", [0, 5, 2**31 - 1])
def test_default_cpu_stream_matches_its_documented_formula(seed):
    shape = (7, 9)  # 63 elements: the last raw output contributes three of its four words
    assert quant.uniform(seed, shape).flatten().tolist() == _default_u_spec(seed, 63)
    big = quant.uniform(seed, (700, 1000)).flatten()
    assert big[-6:].tolist() == _default_u_spec(seed, 700_000)[-6:]


def test_default_cpu_stream_is_the_16_bit_midpoint_grid_and_uniform():
    u = quant.uniform(11, (700, 1000)).flatten().to(torch.float64)
    k = u * 2**16 - 0.5
    assert torch.equal(k, k.round()) and k.min() >= 0 and k.max() <= 2**16 - 1
    # Mean of 700k U[0,1) draws: sd = sqrt(1/12 / 700000) = 3.5e-4; 5 sd = 1.7e-3.
    assert abs(u.mean().item() - 0.5) < 1.7e-3
    # Consecutive words (the four quarters of one raw output) uncorrelated: the sample
    # correlation of 350k pairs has sd 1/sqrt(350000) = 1.7e-3.
    c = torch.corrcoef(torch.stack([u[0::2], u[1::2]]))[0, 1].item()
    assert abs(c) < 5 * 1.7e-3


def test_default_stream_rounding_probability_is_the_rounded_fraction():
    """The bias bound of the module docstring, exactly: with u on the midpoints (k + 1/2) / 2^16,
    floor(v + u) rounds up for exactly round(2^16 f) of the 2^16 values of u. Checked on every
    grid value of u at once (not by sampling), for fractions on and between grid points."""
    grid = (torch.arange(2**16, dtype=torch.float64) + 0.5) / 2**16
    for f in (0.0, 0.25, 1 / 3, 0.5 + 2**-18, 1 - 2**-17, 3 * 2**-17):
        v = torch.tensor(5.0 + f, dtype=torch.float32)
        ups = int((torch.floor(v + grid.to(torch.float32)) == 6).sum())
        fv = float(v) - 5  # f as float32 holds it
        assert ups == math.floor(2**16 * fv + 0.5)
        assert abs(ups / 2**16 - fv) <= 2**-17


@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_quantize_equals_round_to_levels_of_the_scaled_input(stream, mode):
    # quantize() fuses the division into the rounding pass; it must be the same function.
    x = torch.randn(40, 48) * 3
    x[5] = 0.0
    x[7, 3] = float("nan")
    x[9, 1] = float("-inf")
    with _stream(stream):
        q, s = quant.quantize(x, 4, mode, True, seed=21)
        ref = quant.round_to_levels(x / quant.absmax_scale(x, 4, mode), 4, True, seed=21)
    assert torch.equal(q, ref)
    assert torch.equal(s.isnan(), quant.absmax_scale(x, 4, mode).isnan())
