"""Helpers for the differential tests: fast vs reference, allowing only boundary flips.

The two backends compute the 16-point transforms in float32 with different summation orders,
so a transformed value t can differ by a few ulp. Bound (per element): |dt| <= 16 eps sum|x_i h_i|
<= 16 eps * 16 * max|x| / 4, and max|x| over a block <= 4 * amax(t) (orthonormal transform), so
|dt| <= 256 eps amax(t); in code units (v = t * r, r = 1 / scale, scale = amax / qmax)
|dv| <= 256 eps qmax (+1 ulp each from the scale and its reciprocal). A code may therefore differ only where the rounding argument lies within
TOL = 260 * eps * qmax of a rounding boundary (an integer for floor(v + u), k + 1/2 for nearest),
and then by exactly 1.
"""

from __future__ import annotations

import torch

from hot.common import quant
from hot.common.ops import HLAArgs, HQArgs, ScaleMode

EPS32 = 2.0 ** -23


def check_codes(q_fast, s_fast, q_ref, s_ref, t_ref, bits, stochastic, seed, max_frac=1e-3,
                tol=None):
    """Assert fast == reference up to the boundary flips described above; returns #flips.

    ``tol`` (code units, broadcastable to q) overrides the HQ bound; HLA passes its own, since
    its kept coefficients can be much smaller than the block's inputs (then
    |dv| <= 64 eps max|x| / scale + 2 eps qmax)."""
    assert q_fast.shape == q_ref.shape and q_fast.dtype == q_ref.dtype == torch.int8
    assert s_fast.shape == s_ref.shape
    fin = torch.isfinite(s_ref)
    assert torch.equal(torch.isfinite(s_fast), fin), "non-finite scales differ"
    torch.testing.assert_close(s_fast[fin], s_ref[fin], rtol=260 * EPS32, atol=0)
    d = (q_fast.to(torch.int32) - q_ref.to(torch.int32)).cpu()
    assert d.abs().max().item() <= 1 if d.numel() else True, "a code differs by more than 1"
    bad = d != 0
    n = int(bad.sum())
    if n:
        v = t_ref.cpu().float() * quant.reciprocal(s_ref.cpu())
        if stochastic:
            w = v + quant.hash_uniform(seed, tuple(v.shape))
            dist = (w - torch.round(w)).abs()
        else:
            dist = (v - (torch.floor(v) + 0.5)).abs()
        if tol is None:
            tol = 260 * EPS32 * quant.qmax(bits)
        tol = torch.as_tensor(tol, dtype=torch.float32).cpu().expand_as(dist)
        assert bool((dist[bad] <= tol[bad]).all()), f"{n} flips, some far from a boundary: {dist[bad].max()}"
        assert n <= max(1, max_frac * d.numel()), f"{n} of {d.numel()} codes flipped"
    return n

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def x_with_product_near(target, side, divisors=(3, 5, 7, 11, 13), span=512):
    """(x, d): float32 x and an integer d (a 4-bit group of amax 7 d has scale d and the inexact
    reciprocal r = fl32(1/d)) with fl32(x * r) == target while the exact product x * r lies
    strictly on ``side`` (-1 below, +1 above) of target; None if no d in ``divisors`` has one.
    The product of two float32 has at most 48 significant bits, so float(x) * float(r) in
    float64 is exact; x steps by ulps away from fl32(target / r) (tests/common/test_quant.py
    builds the same cases for the reference)."""
    import numpy as np

    for d in divisors:
        r = float(np.float32(1.0) / np.float32(d))
        up = dn = np.float32(target / r)
        for _ in range(span):
            for x in (up, dn):
                exact = float(x) * r
                if float(np.float32(exact)) == target and (exact - target) * side > 0:
                    return float(x), d
            up, dn = np.nextafter(up, np.float32(np.inf)), np.nextafter(dn, np.float32(-np.inf))
    return None


def hq_args(bits, mode, stochastic, seed) -> HQArgs:
    return HQArgs(bits, ScaleMode(mode), stochastic, seed)


def hla_args(rank, selection, bits, mode, stochastic, seed) -> HLAArgs:
    return HLAArgs(rank, selection, bits, ScaleMode(mode), stochastic, seed)
