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
# |E[floor(v+u)] - v| for u on each stream's grid (quant docstring): both streams draw u from
# the 16-bit midpoints (k + 1/2) / 2^16.
U_GRID_BIAS = {"default": 2.0**-17, "hash": 2.0**-17}


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


def _hash_u_spec(seed, i):
    # u of index i on the hash stream, from the quant module docstring with Python ints: one
    # mix32 per pair (i >> 1), its low 16 bits for even i and its high 16 bits for odd i.
    key = _mix32_spec((seed & 0xFFFFFFFF) ^ 0x9E3779B9)
    w = _mix32_spec(((i >> 1) & 0xFFFFFFFF) ^ key)
    k = (w & 0xFFFF) if i % 2 == 0 else (w >> 16)
    return (k + 0.5) / 2.0**16


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**31 - 1])
def test_hash_uniform_matches_its_documented_formula(seed):
    shape = (3, 37)  # 111 elements: odd, so the last pair is cut in half
    u = quant.hash_uniform(seed, shape)
    flat = u.flatten().tolist()
    assert flat == [_hash_u_spec(seed, i) for i in range(len(flat))]
    with quant.hash_rng():
        assert quant.rng_mode() == "hash"
        assert torch.equal(quant.uniform(seed, shape), u)
    assert quant.rng_mode() == "default"


def test_hash_stream_pairs_share_one_hash():
    """Pinned by hand on seed 7: indices 2m and 2m + 1 are the two halves of one mix32 value,
    and the pair counter is i >> 1 (so 4 and 5 hash m = 2, not 4 or 5)."""
    key = _mix32_spec(7 ^ 0x9E3779B9)
    u = quant.hash_uniform(7, (6,)).tolist()
    for m in range(3):
        w = _mix32_spec(m ^ key)
        assert u[2 * m] * 2**16 - 0.5 == w & 0xFFFF
        assert u[2 * m + 1] * 2**16 - 0.5 == w >> 16
    # Not the old one-hash-per-index stream: u[1] would be mix32(1 ^ key) >> 8 / 2^24 there.
    assert u[1] != (_mix32_spec(1 ^ key) >> 8) / 2.0**24


@pytest.mark.parametrize("seed", [0, 99])
def test_hash_stream_halves_are_uniform_and_uncorrelated(seed):
    """Both streams' u are on the midpoint grid; the hash stream's two halves of one hash must
    behave like independent draws. n = 2^18 values: each of 16 equal bins of u holds n / 16
    in expectation with sd sqrt(n p (1 - p)) = 124; 5 sd. The sample correlation of the 2^17
    (even, odd) pairs has sd 1 / sqrt(2^17) = 0.0028; 5 sd."""
    n = 1 << 18
    u = quant.hash_uniform(seed, (n,)).to(torch.float64)
    k = u * 2**16 - 0.5
    assert torch.equal(k, k.round()) and k.min() >= 0 and k.max() <= 2**16 - 1
    counts = torch.bincount((u * 16).floor().long(), minlength=16).to(torch.float64)
    assert ((counts - n / 16).abs() <= 5 * (n * (1 / 16) * (15 / 16)) ** 0.5).all()
    c = torch.corrcoef(torch.stack([u[0::2], u[1::2]]))[0, 1].item()
    assert abs(c) < 5 / (n // 2) ** 0.5


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
def test_lqs_statistic_matches_monte_carlo(mode):
    """LQS compares sum over tokens of E||t_i - SR(t_i)||^2 / ||t_i||^2 (hot.common.lqs), with
    E||t_i - SR(t_i)||^2 = s^2 sum_j f (1 - f). The Monte Carlo mean over n = 400 seeds of the
    same sum, from the quantizer itself, has standard error sd / sqrt(n), sd estimated from the
    400 samples; 5 of them."""
    from hot.common import lqs
    from hot.common.transforms import hq_transform

    gy = torch.randn(16, 16)
    gy[3] *= 30  # an outlier token makes the two modes differ
    stats = lqs.statistics(gy, 4)
    expect = float(stats[0] if mode == "row" else stats[1])
    assert float(stats[2]) == 16
    t = hq_transform(gy)
    errs = []
    for seed in range(400):
        q, s = quant.quantize(t, 4, mode, True, seed=seed)
        errs.append(((q.float() * s - t) ** 2).sum(1).div(t.square().sum(1)).sum().item())
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
        r = quant.reciprocal(quant.absmax_scale(x, 4, mode))
        ref = quant.round_to_levels(x * r, 4, True, seed=21)
    assert torch.equal(q, ref)
    assert torch.equal(s.isnan(), quant.absmax_scale(x, 4, mode).isnan())


# --- the reciprocal and the order of the roundings (the spec that the kernels reproduce) -------

def test_reciprocal_is_correctly_rounded_and_flushes_on_overflow():
    # float64 1/s rounded to float32 is the correctly rounded float32 reciprocal (double
    # rounding is innocuous for division when 53 >= 2 * 24 + 2).
    g = torch.Generator().manual_seed(0)
    s = torch.cat([torch.rand(100_000, generator=g) * 10 + 1e-3,
                   torch.tensor([1.0, 3.0, 2.0**-127, 3e38, 1e-38])])
    want = (1 / s.to(torch.float64)).to(torch.float32)
    assert torch.equal(quant.reciprocal(s), want)
    # 1 / s overflows for s < 2^-128: r = 0 (flush); Inf -> 0, NaN -> NaN.
    r = quant.reciprocal(torch.tensor([2.0**-128, 2.0**-140, float("inf"), float("nan")]))
    assert r[:3].tolist() == [0.0, 0.0, 0.0] and math.isnan(r[3].item())


def _f32(a):
    return float(np.float32(a))


def _x_with_product_near(target, r, side, span=4096):
    """A float32 x with fl32(x * r) == target while the exact product x * r lies strictly on
    ``side`` (-1 below, +1 above) of target. The product of two float32 has at most 48
    significant bits, so float(x) * float(r) in float64 is exact; x steps by ulps away from
    fl32(target / r) in both directions until one fits (about every other step does)."""
    up = dn = np.float32(target / r)
    for _ in range(span):
        for x in (up, dn):
            exact = float(x) * float(r)
            if float(np.float32(exact)) == target and (exact - target) * side > 0:
                return float(x)
        up, dn = np.nextafter(up, np.float32(np.inf)), np.nextafter(dn, np.float32(-np.inf))
    raise AssertionError(f"no float32 x found for target {target}")


# A 4-bit tensor-mode group whose amax is 21 has scale 3 and r = fl32(1/3), an inexact
# reciprocal, so products x * r carry bits below float32's precision.
_AMAX, _R = 21.0, float(np.float32(1.0) / np.float32(3.0))


def test_stochastic_rounding_adds_u_to_the_rounded_product():
    """The spec rounds v = fl32(x * r) before adding u; an FMA fl32(x * r + u) is a different
    function. Built case: x with fl32(x * r) == -u exactly but x * r = -u - d, 0 < d < half an
    ulp of u. Separately rounded: -u + u = 0, floor 0. Fused: fl32(-d) < 0, floor -1. So the
    reference must give 0 there, and a kernel that contracted t * r + u would give -1 (the
    kernel test tests/fast/test_quant_interp.py::test_epilogue_is_not_contracted uses this)."""
    seed, i = 4, 1
    with quant.hash_rng():
        u = quant.uniform(seed, (1, 2))[0, i].item()
    x = _x_with_product_near(-u, _R, -1)
    exact = x * _R
    assert math.floor(float(np.float32(exact + u))) == -1  # what an FMA would give
    assert math.floor(float(np.float32(np.float32(exact) + np.float32(u)))) == 0
    t = torch.tensor([[_AMAX, x]])
    with quant.hash_rng():
        q, s = quant.quantize(t, 4, "tensor", True, seed)
    assert s.item() == 3.0 and q[0, 0].item() == 7
    assert q[0, i].item() == 0


def _x_with_product_near_any(target, side):
    """(x, amax) as _x_with_product_near over a few 4-bit tensor-mode groups (amax = 7 * d,
    scale d, r = fl32(1/d) inexact for each d): for one r the exact products near a target are
    spaced by a fixed step, so some (target, side) have no such x; another d has one."""
    for d in (3, 5, 7, 11, 13):
        r = float(np.float32(1.0) / np.float32(d))
        try:
            return _x_with_product_near(target, r, side, span=512), 7.0 * d
        except AssertionError:
            continue
    return None


def test_nearest_rounding_rounds_the_product_first():
    """Half-even on fl32(x * r): for each half-way point h, x with fl32(x * r) == h but the exact
    product on the side of h away from its even neighbour; the spec rounds the tie to even, an
    FMA of v - floor(v) would see d != 1/2 and round to the other neighbour."""
    found = 0
    for h in (0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5):
        even = h + 0.5 if (h + 0.5) % 2 == 0 else h - 0.5
        side = -1 if even > h else 1  # the exact product lies away from the even neighbour
        hit = _x_with_product_near_any(h, side)
        if hit is None:
            continue
        x, amax = hit
        q, s = quant.quantize(torch.tensor([[amax, x]]), 4, "tensor", False, 0)
        assert s.item() == amax / 7 and q[0, 1].item() == even, (h, x, amax)
        found += 1
    assert found >= 4, found


def test_quantize_multiplies_by_the_reciprocal_not_divides():
    """Codes follow fl32(x * fl32(1/scale)), not fl32(x / scale): near half-way points h * d (d
    the scale) find x where the two give different nearest codes, and check the reference takes
    the product."""
    found = 0
    for d in (3, 5, 7, 11):
        r32 = np.float32(1.0) / np.float32(d)
        for h in (0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5):
            for direction in (np.inf, -np.inf):
                x = np.float32(h * d)
                for _ in range(32):
                    x = np.nextafter(x, np.float32(direction))
                    by_mul, by_div = np.float32(x * r32), np.float32(x / np.float32(d))
                    if np.round(by_mul) != np.round(by_div):
                        q, _ = quant.quantize(torch.tensor([[7.0 * d, float(x)]]), 4, "tensor",
                                              False, 0)
                        assert q[0, 1].item() == int(np.round(by_mul))
                        found += 1
    assert found >= 1


def test_tiny_groups_flush_to_zero_codes_and_keep_their_scale():
    # amax 2^-126 (4 bits): scale 2^-126 / 7 < 2^-128, so 1 / scale overflows: codes 0, scale
    # kept. amax 2^-122: r finite, ordinary codes.
    x = torch.tensor([[2.0**-126, -2.0**-127, 0.0], [2.0**-122, -2.0**-123, 0.0]])
    for stochastic in (False, True):
        q, s = quant.quantize(x, 4, "row", stochastic, 3)
        assert torch.equal(s, (x.abs().amax(1, keepdim=True) / 7))
        assert q[0].tolist() == [0, 0, 0]
        assert q[1, 0].item() == 7 and q[1, 1].item() in (-3, -4)


@given(st.floats(-7, 7, width=32), st.integers(0, 2**31 - 1), st.sampled_from(STREAMS))
def test_stochastic_rounding_mean_is_v(v, seed, stream):
    """n = 4096 draws of one value v: q = floor(v) + B with B Bernoulli(p), p the grid's
    P(round up) = round(2^16 f) / 2^16 (|p - f| <= 2^-17, f = frac(v)). The mean has sd
    sqrt(p (1 - p) / n); allow 5 sd plus the grid bias. (Fixed seeds: derandomized profile.)"""
    n = 4096
    with _stream(stream):
        q = quant.round_to_levels(torch.full((n,), v), 4, True, seed).to(torch.float64)
    f = v - math.floor(v)
    p = round(2**16 * f) / 2**16
    assert ((q == math.floor(v)) | (q == math.floor(v) + 1)).all() or f == 0
    bound = 5 * math.sqrt(p * (1 - p) / n) + 2.0**-17
    assert abs(q.mean().item() - v) <= bound


@pytest.mark.parametrize("f", [0.0, 0.25, 1 / 3, 0.5 + 2**-18, 1 - 2**-17, 3 * 2**-17])
def test_hash_stream_rounds_up_exactly_where_its_threshold_says(f):
    """The exact bias of the hash stream: floor(v + u) rounds up iff k >= 2^16 - round(2^16 f)
    for u = (k + 1/2) / 2^16, with k computed here from the formula, so over the uniform k the
    probability of rounding up is round(2^16 f) / 2^16 exactly, the 2^-17 bias bound."""
    n, seed = 2048, 17
    v = _f32(5.0 + f)
    fv = v - 5.0
    with quant.hash_rng():
        q = quant.round_to_levels(torch.full((n,), v), 8, True, seed)
    ks = [round(_hash_u_spec(seed, i) * 2**16 - 0.5) for i in range(n)]
    threshold = 2**16 - math.floor(2**16 * fv + 0.5)
    assert q.tolist() == [6 if k >= threshold else 5 for k in ks]
