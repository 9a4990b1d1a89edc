"""The drawn HLA selection's definition (hot.common.walsh, transforms, quant) and its config."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import hot
from hot.common import quant, walsh
from hot.common.config import STRATA, HOTConfigError, hq_bits
from hot.common.transforms import drawn_transform, hla_transform


def _t(rank: int, m: int) -> torch.Tensor:
    """T for one block with draw m: weighted kept rows of walsh(16) times the draw's signs."""
    signs = walsh.draw_signs(torch.tensor(m)).double()
    return walsh.hla_matrix(rank, "stratified") * signs[None, :]


def test_a_draw_moves_rows_inside_their_sequency_band():
    w = walsh.walsh(16)
    for m in (0, 4, 8, 12):
        moved = w * walsh.draw_signs(torch.tensor(m)).double()[None, :]
        # each signed row is +- a row of the same band
        match = (moved @ w.t()).abs().round()
        assert torch.equal(match.sum(1), torch.ones(16, dtype=torch.float64))
        k_to = match.argmax(1)
        assert torch.equal(k_to // 4, torch.arange(16) // 4)


@pytest.mark.parametrize("rank", sorted(STRATA))
def test_expectation_over_the_four_draws_is_the_identity(rank):
    """E[T^T T] = I exactly (each draw m in {0, 4, 8, 12} has probability 1/4): unbiased."""
    mean = sum(_t(rank, m).t() @ _t(rank, m) for m in (0, 4, 8, 12)) / 4
    torch.testing.assert_close(mean, torch.eye(16, dtype=torch.float64), rtol=0, atol=1e-12)


def test_block_draws_are_uniform_and_follow_the_seed():
    d = quant.block_draws(123, 40000)
    assert set(d.unique().tolist()) == {0, 4, 8, 12}
    counts = torch.bincount(d // 4, minlength=4).double() / len(d)
    # 4 categories, n = 40000: sd of a share sqrt(p (1 - p) / n) = 0.0022; 5 sd
    assert (counts - 0.25).abs().max() < 0.011
    assert torch.equal(quant.block_draws(123, 100), d[:100])
    assert not torch.equal(quant.block_draws(124, 100), d[:100])


def test_drawn_transform_is_the_per_block_matrix_product():
    x = torch.randn(40, 3, dtype=torch.float64)
    coef, amax = drawn_transform(x, 8, 77)
    m = quant.block_draws(77, 3)
    xp = torch.nn.functional.pad(x, (0, 0, 0, 8)).reshape(3, 16, 3)
    want = torch.stack([_t(8, int(m[j])) @ xp[j] for j in range(3)])  # (nb, 8, C)
    torch.testing.assert_close(coef, want.permute(2, 0, 1).reshape(3, 24))
    full = torch.stack([walsh.full_matrix(8) * walsh.draw_signs(m[j]).double()[None, :] @ xp[j]
                        for j in range(3)])
    torch.testing.assert_close(amax, full.abs().amax((0, 1)))
    assert torch.equal(hla_transform(x, 8, "stratified", 77), coef)
    # the all-row absmax does not depend on the draw (rows only move inside a band)
    torch.testing.assert_close(drawn_transform(x, 8, 78)[1], amax)


def test_config_errors_name_the_fix():
    with pytest.raises(HOTConfigError, match="rank 4 or 8"):
        hot.HLAConfig(selection="stratified", rank=2)
    with pytest.raises(HOTConfigError, match="fixed row selection"):
        hot.HLAConfig(selection="stratified", amax="delayed")
    with pytest.raises(HOTConfigError, match="hla.selection"):
        hot.HOTConfig.lbp_wht().replace(hla={"selection": "stratified"})
    with pytest.raises(HOTConfigError, match="auto, 4 or 8|4 or 8"):
        hot.HQConfig(bits=5)


def test_defaults_and_presets():
    d, p = hot.HOTConfig(), hot.HOTConfig.paper()
    assert (d.hla.selection, d.hq.bits) == ("auto", "auto")
    assert (p.hla.selection, p.hq.bits) == ("lowpass", 4)
    assert hot.HOTConfig.recommended(10).hla.selection == "lowpass"
    assert hq_bits("auto", "cpu") == 8 and hq_bits(4, "cpu") == 4 and hq_bits(None, "cpu") == 0


def test_auto_resolves_per_layer_type():
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(16, 4))
    hot.convert(m, convert_head=True)
    assert m[0].hot_config == m[2].hot_config == hot.HOTConfig()  # as given
    assert m[0].hot_run_config.hla.selection == "lowpass"
    assert m[2].hot_run_config.hla.selection == "stratified"
    hot.set_config(m, hot.HOTConfig.paper())
    assert m[2].hot_run_config.hla.selection == "lowpass"
