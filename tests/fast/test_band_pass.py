"""An HQ pass with per-row scales alone, read once (hot.fast.passes.BandPlan: onepass_kernel's
bands without the HLA part): the same codes and scales, bit for bit, as the two-kernel pass
(stats_kernel, quantize_kernel), since its rows' absmax comes from the same dot and its codes
from the same butterfly and rounding. The quantized forward's passes over x and W take it on a
GPU.

Under the Triton interpreter programs run one after another, so a band can complete only when it
is one program (x at most one tile wide, C <= the tile's columns); there the plan is forced. On a
GPU, wide shapes run real bands of many programs."""

from __future__ import annotations

import pytest
import torch
from _fast_diff import DEVICE, hla_args, hq_args

from hot.common.options import options
from hot.fast import passes
from hot.fast import quantize as fq


def _x(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[: max(1, shape[0] // 7)] *= 20  # rows of different magnitudes: per-row scales differ
    return x.to(dtype).to(DEVICE)


def _both(x, hq):
    """(band pass, two-kernel pass) outputs over x; asserts the band ran."""
    p = passes.plan_for(x, hq, None)
    assert p.band is not None
    out = fq.run_pass(x, p, hq, None)
    assert fq._BAND_FITS[p.uid], "the band did not fit: the two kernels ran instead"
    two = passes.plan_for(x, hq, None, band=False)
    assert two.band is None
    return out, fq.run_pass(x, two, hq, None)


def _same(a, b):
    assert torch.equal(a.hq_q, b.hq_q), (a.hq_q.int() - b.hq_q.int()).abs().max()
    assert torch.equal(a.hq_s, b.hq_s)
    assert a.hla_q is None and a.hla_s is None and a.bsum is None


@pytest.fixture
def one_program_bands(monkeypatch):
    """Under the interpreter: plans with bands (one program each: the test's x is one tile
    wide), marked as fitting (the occupancy check needs a GPU)."""
    if DEVICE == "cuda":
        yield
        return
    monkeypatch.setattr(passes, "band_capable", lambda dev: True)
    passes.clear_plans()
    real = passes.plan_for

    def plan_for(x, hq, hla, *a, **kw):
        p = real(x, hq, hla, *a, **kw)
        if p.band is not None:
            assert p.band.n_ct == 1, "the interpreter cannot wait for a band of several programs"
            fq._BAND_FITS.setdefault(p.uid, True)
        return p

    monkeypatch.setattr(passes, "plan_for", plan_for)
    yield
    passes.clear_plans()


@pytest.mark.parametrize("shape", [(130, 48), (128, 64), (37, 20), (16, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits,stochastic", [(8, False), (4, True)])
def test_band_pass_is_the_two_kernel_pass(one_program_bands, shape, dtype, bits, stochastic):
    if shape[1] > options().tile.cols and DEVICE != "cuda":
        pytest.skip("wider than one tile: bands of several programs need a GPU")
    out, two = _both(_x(shape, dtype, 3), hq_args(bits, "row", stochastic, 9))
    _same(out, two)


def test_no_band_for_other_passes(one_program_bands):
    x = _x((64, 48), torch.float32, 1)
    hla = hla_args(8, "lowpass", 8, "row", True, 6)
    assert passes.plan_for(x, hq_args(8, "tensor", False, 1), None).band is None  # one scale
    assert passes.plan_for(x, hq_args(8, "row", False, 1), hla).band is None  # the g_y pass
    assert passes.plan_for(x, None, hla).band is None


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4133, 777), (32768, 2048), (4096, 8192), (2048, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_band_pass_on_gpu_is_the_two_kernel_pass(shape, dtype):
    """Real bands: up to 128 programs a band (8192 columns of 64), ragged tiles."""
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA GPU")
    for bits, stochastic in ((8, False), (4, True)):
        out, two = _both(_x(shape, dtype, 5), hq_args(bits, "row", stochastic, 11))
        _same(out, two)
    # and the forward's quantizer takes it
    from hot.nn.forward import forward_args

    fq.hq_quantize(_x(shape, dtype, 6), forward_args("int8"))
    p = passes.plan_for(_x(shape, dtype, 6), forward_args("int8"), None)
    assert p.band is not None and fq._BAND_FITS[p.uid]
