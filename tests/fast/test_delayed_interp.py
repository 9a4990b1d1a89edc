"""The passes with a delayed HLA scale (HLAConfig(amax="delayed"), HLAArgs.history) against the
reference over several passes: onepass_kernel + fixup_kernel (HLA alone, i.e. ABC, everywhere;
the g_y pass with per-row HQ on a GPU, where the HQ scales come from the band's counter), and
the stats / fold / quantize path (the g_y pass under the interpreter, or with a per-tensor HQ
scale). Triton interpreter on CPU, compiled on a GPU when one is present; bit-exact in the
hash-stream mode up to the boundary flips of tests/fast/_fast_diff.py.

The histories of the two backends are the absmax each computed, which may differ by the
transforms' float summation order (a few ulp, the bound of _fast_diff.py), so after each pass
they are compared within that bound and the fast one is set to the reference's: every pass then
starts from the same history, and a decision (candidate kept or not) can differ only for an
absmax within ulps of the window's edges, which these inputs do not have."""

from __future__ import annotations

import pytest
import torch

from hot.common import quant
from hot.common.transforms import hla_transform, hq_transform
from hot.fast import passes
from hot.fast import quantize as fq
from hot.reference import ops as ref

from _fast_diff import DEVICE, EPS32, check_codes, hla_args, hq_args

# Per-pass scales of the inputs' distribution: within the window (1 -> 1.5 -> 1.2), far above
# it (x 10: every column redone), far below it (/ 10: redone), back inside, then near the
# window's edges on both sides (/ 3 and x 3: kept, while a window of [h/2, 2h] would not).
SCALES = (1.0, 1.5, 1.2, 12.0, 1.2, 0.9, 0.3, 0.9)


def _x(shape, dtype, seed, scale):
    """One fixed pattern (columns of different magnitudes) times ``scale``, plus 5% noise of
    pass ``seed``: a column's absmax then moves with ``scale`` from pass to pass."""
    base = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    base[:, : max(1, shape[1] // 4)] *= 8
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    return ((base + 0.05 * noise) * scale).to(dtype).to(DEVICE)


def _hist_tol(h):
    # the absmax of the HLA transform, fast against reference: 256 eps of it (_fast_diff.py)
    return dict(rtol=260 * EPS32, atol=0.0)


def _hla_tol(x, s_ref, bits):
    xmax = x.float().abs().amax(0).cpu().reshape(-1, 1)
    return EPS32 * (64 * xmax / s_ref.cpu() + 2 * quant.qmax(bits))


def _run(shape, dtype, hq, stoch, bsum=False):
    """Both backends over SCALES; returns how many columns kept their candidate per pass."""
    c = shape[1]
    h_fast = torch.zeros(c, device=DEVICE)
    h_ref = torch.zeros(c, device=DEVICE)
    kept = []
    for step, scale in enumerate(SCALES):
        x = _x(shape, dtype, 100 + step, scale)
        hla = hla_args(8, "lowpass", 8, "row", stoch, 7 + step)
        a_fast, a_ref = hla._replace(history=h_fast), hla._replace(history=h_ref)
        t = hla_transform(x, 8, "lowpass")
        amax = quant.absmax(t.float(), "row").reshape(-1)
        kept.append(int(quant.delayed_keep(amax, h_ref).sum()))
        if hq is None:
            q, s = fq.hla_quantize(x, a_fast)
        else:
            out = fq.gy_pass(x, hq, a_fast, bsum=bsum)
            q, s = out.hla_q, out.hla_s
        with quant.hash_rng():
            qr, sr = ref.hla_quantize(x, a_ref)
            if hq is not None:
                hqr = ref.hq_quantize(x, hq)
        check_codes(q, s, qr, sr, t, 8, stoch, 7 + step, tol=_hla_tol(x, sr, 8))
        if hq is not None:
            check_codes(out.hq_q, out.hq_s, *hqr, hq_transform(x), hq.bits, hq.stochastic,
                        hq.seed)
        if bsum:
            exact = x.double().sum(0)
            bound = (shape[0] - 1) * 2.0**-24 * x.double().abs().sum(0) + 2.0**-24 * exact.abs()
            assert bool(((out.bsum.double() - exact).abs() <= bound).all())
        torch.testing.assert_close(h_fast, h_ref, **_hist_tol(h_ref))
        torch.testing.assert_close(h_ref.reshape(-1, 1), amax.reshape(-1, 1), rtol=0, atol=0)
        h_fast.copy_(h_ref)
    return kept


@pytest.mark.parametrize("shape", [(64, 64), (50, 40), (130, 200)])
@pytest.mark.parametrize("stoch", [True, False])
def test_abc_pass_matches_reference_over_passes(shape, stoch):
    kept = _run(shape, torch.float32, None, stoch)
    # The cases the inputs were built for: nothing kept on the first pass (no history), every
    # column on the next two, none after the jumps, every column again at the end.
    assert kept[0] == 0 and kept[3] == 0 and kept[4] == 0
    assert kept[1] == kept[2] == kept[5] == kept[6] == kept[7] == shape[1]


@pytest.mark.parametrize("shape", [(64, 64), (50, 40), (128, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gy_pass_matches_reference_over_passes(shape, dtype):
    kept = _run(shape, dtype, hq_args(4, "row", True, 5), True)
    assert kept[0] == 0 and kept[1] == shape[1]


def test_gy_pass_with_bias_sums():
    if not passes.bsum_capable():
        pytest.skip("bias sums need the fixed tile")
    _run((96, 80), torch.bfloat16, hq_args(4, "row", True, 5), True, bsum=True)


def test_per_tensor_hq_takes_the_two_kernel_path():
    # a per-tensor HQ scale cannot come from a band: stats, fold, quantize, the same function
    _run((64, 96), torch.float32, hq_args(4, "tensor", True, 5), True)


def test_band_path_runs_on_the_gpu():
    """On a GPU the g_y pass with per-row HQ and a delayed HLA scale runs onepass_kernel's
    bands (it fits: 4 programs a band), not the two-kernel fallback."""
    if DEVICE != "cuda":
        pytest.skip("the interpreter runs programs one after another: no bands")
    x = _x((256, 256), torch.bfloat16, 1, 1.0)
    hq = hq_args(4, "row", True, 5)
    hla = hla_args(8, "lowpass", 8, "row", True, 6)._replace(history=torch.zeros(256,
                                                                                 device=DEVICE))
    fq.gy_pass(x, hq, hla)
    p = passes.plan_for(x, hq, hla)
    assert p.delayed.band and fq._BAND_FITS[p.uid]


def test_nonfinite_column_and_recovery():
    """A NaN in a column: its scale and its history are NaN, its codes 0; on the next pass the
    NaN history is not a candidate (its own absmax is taken), and the other columns go on."""
    x = _x((64, 48), torch.float32, 3, 1.0)
    h = torch.zeros(48, device=DEVICE)
    a = hla_args(8, "lowpass", 8, "row", True, 1)._replace(history=h)
    fq.hla_quantize(x, a)
    x2 = x.clone()
    x2[5, 3] = float("nan")
    q, s = fq.hla_quantize(x2, a)
    assert torch.isnan(s[3]).all() and (q[3] == 0).all() and torch.isnan(h[3])
    assert torch.isfinite(s[torch.arange(48, device=DEVICE) != 3]).all()
    q3, s3 = fq.hla_quantize(x, a)
    with quant.hash_rng():
        hr = h.clone()
        hr[3] = 0.0  # a NaN history decides like none at all
        qr, sr = ref.hla_quantize(x, a._replace(history=hr))
    assert torch.isfinite(s3).all()
    check_codes(q3, s3, qr, sr, hla_transform(x, 8, "lowpass"), 8, True, 1,
                tol=_hla_tol(x, sr, 8))


def test_history_is_checked():
    x = _x((32, 40), torch.float32, 0, 1.0)
    a = hla_args(8, "lowpass", 8, "row", True, 1)
    for bad in (torch.zeros(39, device=DEVICE), torch.zeros(40, device=DEVICE,
                                                            dtype=torch.float64)):
        with pytest.raises(ValueError, match="history"):
            fq.hla_quantize(x, a._replace(history=bad))
