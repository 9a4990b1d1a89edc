"""Helpers for the differential tests: fast vs reference, allowing only boundary flips.

The two backends compute the 16-point transforms in float32 with different summation orders,
so a transformed value t can differ by a few ulp. Bound (per element): |dt| <= 16 eps sum|x_i h_i|
<= 16 eps * 16 * max|x| / 4, and max|x| over a block <= 4 * amax(t) (orthonormal transform), so
|dt| <= 256 eps amax(t); in code units (v = t / scale, scale = amax / qmax) |dv| <= 256 eps qmax
(+1 ulp from the scale). A code may therefore differ only where the rounding argument lies within
TOL = 260 * eps * qmax of a rounding boundary (an integer for floor(v + u), k + 1/2 for nearest),
and then by exactly 1.
"""

from __future__ import annotations

import torch

from hot.common import quant

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
        v = (t_ref.cpu().float() / s_ref.cpu())
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
