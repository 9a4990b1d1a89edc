"""The quantize-kernel variants of hot/fast/quant_kernels_v4.py (HOT_FAST_QKERNEL) against the
reference in the hash-stream mode and against the "dot" kernel (Triton interpreter on CPU, or
compiled on a GPU when one is present).

Every variant must give the reference's scales and codes up to the boundary flips that
tests/fast/_fast_diff.py derives (float summation order of the 16-point transforms), and so must
agree with "dot" up to such flips too: a code where the two differ lies within that distance of a
rounding boundary in the reference's numbers (check_codes with the dot outputs in place of the
reference's codes, the reference transform for the distance)."""

from __future__ import annotations

import pytest
import torch

from hot.common import quant
from hot.fast import arch
from hot.fast import quant as fq
from hot.reference import ops as ref

from _fast_diff import DEVICE, EPS32, check_codes, run_variant

VARIANTS = [v for v in arch.QKERNELS if v != "dot"]

# (shape, dtype, transposed view, hq (bits, mode, stoch, seed) or None,
#  hla (rank, selection, bits, mode, stoch, seed) or None). Shapes but the last are not multiples
# of the 64-row tile nor of 16; together they cover fp32/bf16/fp16, 'row' and 'tensor' scales,
# HQ only, HLA only and fused, ranks 1-16 (1 both nearest and stochastic), both selections,
# nearest and stochastic rounding.
CASES = [
    ((50, 70), torch.float32, False, (4, "row", True, 11), (8, "lowpass", 8, "row", True, 12)),
    ((37, 21), torch.bfloat16, False, (8, "tensor", False, 3), (16, "lp_l1", 8, "tensor", True, 4)),
    ((70, 33), torch.float16, False, None, (1, "lowpass", 4, "row", False, 5)),
    ((19, 48), torch.float32, False, None, (2, "lp_l1", 8, "tensor", True, 6)),
    ((66, 40), torch.bfloat16, False, (4, "row", True, 7), (4, "lowpass", 8, "row", True, 8)),
    ((40, 24), torch.float32, True, (4, "row", True, 9), None),  # W^T as a transposed view
    # Rank 1 stochastic: no pair within a block, the kernels hash per code (quant_kernels._u_at).
    ((45, 26), torch.float32, False, None, (1, "lowpass", 8, "row", True, 13)),
    # Multiples of the 64 x 64 tile: the EVEN kernels (unmasked loads and stores).
    ((128, 192), torch.bfloat16, False, (4, "row", True, 14), (8, "lowpass", 8, "row", True, 15)),
]


def _x(shape, dtype, transposed, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x[: max(1, shape[0] // 5)] *= 30  # heavy-tailed rows: row and tensor scales differ
    x = x.to(dtype).to(DEVICE)
    return x.t().contiguous().t() if transposed else x  # same values, column-major strides


_DOT: dict = {}


def _dot(i, x, hq, hla):
    if i not in _DOT:
        _DOT[i] = run_variant("dot", x, hq, hla)
    return _DOT[i]


def _hla_tol(x, s, bits):
    # HLA's own flip distance (tests/fast/test_quant_interp.py): kept coefficients can be much
    # smaller than the block's inputs, |dv| <= 64 eps max|x| / scale + 2 eps qmax.
    xmax = x.float().abs().amax(0).cpu().reshape(-1, 1)
    return EPS32 * (64 * xmax / s.cpu() + 2 * quant.qmax(bits))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_reference_and_dot(variant):
    flips = 0
    for i, (shape, dtype, tr, hq, hla) in enumerate(CASES):
        x = _x(shape, dtype, tr, i)
        out = run_variant(variant, x, hq, hla)
        dot = _dot(i, x, hq, hla)
        if hq:
            with quant.hash_rng():
                qr, sr = ref.hq_quantize(x, *hq)
            t = ref.hq_transform(x)
            flips += check_codes(out[0], out[1], qr, sr, t, hq[0], hq[2], hq[3])
            flips += check_codes(out[0], out[1], dot[0], dot[1], t, hq[0], hq[2], hq[3])
        else:
            assert out[0] is None and out[1] is None
        if hla:
            with quant.hash_rng():
                qr, sr = ref.hla_quantize(x, *hla)
            t = ref.hla_transform(x, hla[0], hla[1])
            tol = _hla_tol(x, sr, hla[2])
            flips += check_codes(out[2], out[3], qr, sr, t, hla[2], hla[4], hla[5], tol=tol)
            flips += check_codes(out[2], out[3], dot[2], dot[3], t, hla[2], hla[4], hla[5], tol=tol)
        else:
            assert out[2] is None and out[3] is None
    # Over ~25k codes a handful of boundary flips at most (check_codes bounds each case).
    assert flips <= 20, flips


@pytest.mark.parametrize("variant", ["bfly", "k16_bfly"])
def test_butterflies_keep_inf_in_its_block(variant):
    """Butterflies never multiply by the zero entries of a block-diagonal matrix, so an Inf
    input gives the reference's Inf scale (not NaN) where it sits, and NaN stays NaN."""
    x = torch.randn(32, 48)
    x[3] = 0.0
    x[5, 7] = float("nan")
    x[9, 20] = float("inf")
    x = x.to(DEVICE)
    q, s, qh, sh = run_variant(variant, x, (4, "row", True, 1), (8, "lowpass", 8, "row", False, 0))
    qr, sr = ref.hq_quantize(x, 4, "row", True, 1)
    qhr, shr = ref.hla_quantize(x, 8, "lowpass", 8, "row", False, 0)
    for a, b in ((s, sr), (sh, shr)):
        assert torch.equal(torch.isnan(a.cpu()), torch.isnan(b.cpu()))
        assert torch.equal(torch.isinf(a.cpu()), torch.isinf(b.cpu()))
    assert s[3].item() == 1.0 and (q[3] == 0).all() and (q[[5, 9]] == 0).all()
    assert (qh[[7, 20]] == 0).all() and torch.isfinite(sh[[0, 1, 2]]).all()


def test_qkernel_env_is_validated(monkeypatch):
    monkeypatch.setenv("HOT_FAST_QKERNEL", "fastest")
    with pytest.raises(ValueError, match="HOT_FAST_QKERNEL='fastest'.*'dot'.*'bfly'.*default 'mix'"):
        arch._qkernel()
    monkeypatch.setenv("HOT_FAST_QKERNEL", " BFLY ")
    assert arch._qkernel() == "bfly"
    monkeypatch.delenv("HOT_FAST_QKERNEL")
    assert arch._qkernel() == arch.DEFAULT_QKERNEL == "mix"


def test_sel_packs_the_kept_sylvester_rows():
    # T_r row t must equal sylvester(16) row n_t / 4 (the kernels' z_t = y[n_t] / 4).
    from hot.common.walsh import hla_matrix, sylvester

    for rank in (1, 2, 4, 8, 16):
        for sel in ("lowpass", "lp_l1"):
            packed = fq._sel(rank, sel)
            n = [(packed >> (4 * t)) & 15 for t in range(rank)]
            assert torch.equal(sylvester(16)[n] / 4, hla_matrix(rank, sel))
