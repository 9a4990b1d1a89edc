"""The one-read g_y pass (HLAArgs.history, HLAConfig(gy_amax="delayed")) against the reference:
the Triton interpreter on CPU, compiled on a GPU when one is present. Codes may differ only by
the boundary flips of tests/fast/_fast_diff.py (float summation order of the transforms);
scales and the updated history agree to the same 260 eps; the HQ half is bit for bit the
ordinary pass's (the same amax by the same dot, the same butterfly)."""

from __future__ import annotations

import pytest
import torch

from hot.common import quant
from hot.common.transforms import hla_transform
from hot.fast import quantize as fq
from hot.reference import ops as ref

from _fast_diff import DEVICE, EPS32, check_codes, hla_args, hq_args


def _hla_tol(x, s_ref, bits):
    xmax = x.float().abs().amax(0).cpu().reshape(-1, 1)
    return EPS32 * (64 * xmax / s_ref.cpu() + 2 * quant.qmax(bits))


def _x(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[: max(1, shape[0] // 5)] *= 30
    return x.to(dtype).to(DEVICE)


def _one_step(x, hq, hla, hist_f, hist_r):
    """One delayed pass on both backends; checks codes, scales and the updated histories, and
    returns the reference's scales."""
    a = hla._replace(history=hist_f)
    if hq is None:
        qf, sf = fq.hla_quantize(x, a)
    else:
        (q1, s1), (qf, sf) = fq.gy_quantize(x, hq, a)
        p1, t1 = fq.hq_quantize(x, hq)  # the ordinary pass: the same HQ half, bit for bit
        assert torch.equal(q1, p1)
        torch.testing.assert_close(s1, t1, rtol=0, atol=0, equal_nan=True)
    with quant.hash_rng():
        qr, sr = ref.hla_quantize(x, hla._replace(history=hist_r))
    check_codes(qf, sf, qr, sr, hla_transform(x, hla.rank, hla.selection), hla.bits,
                hla.stochastic, hla.seed, tol=_hla_tol(x, sr, hla.bits))
    fin = torch.isfinite(hist_r)
    assert torch.equal(torch.isfinite(hist_f), fin)
    torch.testing.assert_close(hist_f[fin], hist_r[fin], rtol=260 * EPS32, atol=0)
    return sr


@pytest.mark.parametrize("shape,dtype,rank,with_hq", [
    ((70, 40), torch.float32, 8, True),      # ragged: masked tiles
    ((128, 64), torch.float32, 8, True),     # tiles inside x
    ((96, 200), torch.bfloat16, 4, True),
    ((33, 17), torch.float32, 16, False),    # HLA alone (g_W only)
    ((50, 24), torch.float32, 1, True),
])
def test_delayed_pass_matches_reference_over_steps(shape, dtype, rank, with_hq):
    """Three steps from an empty history: step 0 takes every column's own absmax; later steps
    keep the candidate 2h where the column moved little and fall back where it moved outside
    the window (columns scaled by 0.05 and by 20 between steps)."""
    x = _x(shape, dtype, 1)
    hq = hq_args(4, "row", True, 5) if with_hq else None
    hla = hla_args(rank, "lowpass", 8, "row", True, 7)
    c = shape[1]
    hist_f = torch.zeros(c, device=DEVICE)
    hist_r = torch.zeros(c, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    for step in range(3):
        prev = hist_r.clone()
        sr = _one_step(x, hq, hla._replace(seed=7 + step), hist_f, hist_r)
        amax = hist_r  # the reference's absmax of this step
        kept = (prev > 0) & (amax <= 2 * prev) & (4 * amax >= 2 * prev)
        want = torch.where(kept, 2 * prev / 127, torch.where(amax == 0, 1.0, amax / 127))
        torch.testing.assert_close(sr.reshape(-1), want, rtol=0, atol=0)
        if step == 0:
            assert not kept.any()
        else:
            assert kept.any() and (~kept).any()
        f = (1 + 0.2 * torch.randn(c, generator=g)).abs()
        f[::5], f[1::7] = 0.05, 20.0
        x = (x.float() * f.to(DEVICE)).to(dtype)


def test_non_finite_g_y_poisons_its_column_and_the_next_step_recovers():
    x = _x((64, 32), torch.float32, 2)
    hq, hla = hq_args(4, "row", True, 1), hla_args(8, "lowpass", 8, "row", True, 2)
    hist_f = torch.zeros(32, device=DEVICE)
    hist_r = torch.zeros(32, device=DEVICE)
    _one_step(x, hq, hla, hist_f, hist_r)
    bad = x.clone()
    bad[5, 3] = float("nan")
    bad[9, 4] = float("inf")
    sr = _one_step(bad, hq, hla, hist_f, hist_r)
    assert not torch.isfinite(sr[3]).item() and not torch.isfinite(sr[4]).item()
    assert not torch.isfinite(hist_r[3]).item() and not torch.isfinite(hist_f[3]).item()
    sr = _one_step(x, hq, hla, hist_f, hist_r)  # a non-finite history falls back to the absmax
    assert torch.isfinite(sr).all() and torch.isfinite(hist_f).all()


def test_bias_sums_of_the_one_read_pass():
    from hot.fast.quantize import gy_pass

    x = _x((96, 48), torch.float32, 4)
    hq, hla = hq_args(4, "row", True, 1), hla_args(8, "lowpass", 8, "row", True, 2)
    out = gy_pass(x, hq, hla._replace(history=torch.zeros(48, device=DEVICE)), bsum=True)
    torch.testing.assert_close(out.bsum, x.float().sum(0), rtol=1e-5, atol=1e-4)


def test_history_must_match_the_columns():
    x = _x((32, 16), torch.float32, 5)
    a = hla_args(8, "lowpass", 8, "row", True, 2)._replace(
        history=torch.zeros(15, device=DEVICE))
    with pytest.raises(ValueError, match="HLAArgs.history"):
        fq.hla_quantize(x, a)
