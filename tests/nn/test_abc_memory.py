"""ABC: what a HOT layer keeps between forward and backward, counted with saved_tensors_hooks.

Exact formula for the paper setting (rank r = 8, INT8, per-channel scales) and a layer input
with L tokens of I features: the int8 copy T x is I x (L16 / 16 * r) bytes and the scales are
I float32, i.e. I * L16 * r / 16 + 4 I bytes, against 4 L I bytes for the fp32 x that
nn.Linear saves. For L a multiple of 16 the ratio is 1/8 + 1/L: the 1/8 of the paper plus the
scales (so "at most 1/8" never holds exactly; the scales cost 1/L).
"""

import pytest
import torch
import torch.nn as nn

import hot
from hot_testing import hot_copy, nbytes, saved_by_forward, wrap

# The paper's codes: the fixed low-pass rows (a drawn selection also keeps its step, below).
PAPER = hot.HOTConfig(hla=hot.HLAConfig(selection="lowpass"))


def _abc_bytes(tokens, feats, rank=8, scale="channel"):
    l16 = -(-tokens // 16) * 16
    return feats * (l16 // 16 * rank) + 4 * (feats if scale == "channel" else 1)


@pytest.mark.parametrize("rank", [1, 2, 4, 8, 16])
def test_linear_saves_only_the_int8_low_rank_copy(rank):
    torch.manual_seed(0)
    tokens, feats = 256, 48
    model = hot_copy(wrap(nn.Linear(feats, 32)), PAPER.replace(hla={"rank": rank}))
    x = torch.randn(4, tokens // 4, feats, requires_grad=True)
    y, others, params = saved_by_forward(model, x)
    assert {t.dtype for t in others} == {torch.int8, torch.float32}
    assert [t.dtype for t in others if t.numel() > feats] == [torch.int8]
    assert nbytes(others) == _abc_bytes(tokens, feats, rank)
    if rank == 8:
        ratio = nbytes(others) / (4 * x.numel())
        assert ratio == pytest.approx(1 / 8 + 1 / tokens, abs=1e-12)
        assert ratio <= 1 / 8 + 1 / tokens
    # The weight is kept for the g_x path; it is a Parameter, not an extra buffer.
    assert [p.shape for p in params] == [model[0].weight.shape]
    y.sum().backward()  # the saved set is enough to run backward


def test_padding_and_tensor_scale_are_counted_exactly():
    model = hot_copy(wrap(nn.Linear(10, 6)), PAPER.replace(hla={"scale": "tensor"}))
    x = torch.randn(37, 10, requires_grad=True)  # 37 tokens -> 48 padded
    _, others, _ = saved_by_forward(model, x)
    assert nbytes(others) == _abc_bytes(37, 10, scale="tensor") == 10 * 24 + 4


def test_plain_linear_saves_fp32_input():
    lin = nn.Linear(48, 32)
    x = torch.randn(256, 48, requires_grad=True)
    _, others, _ = saved_by_forward(wrap(lin), x)
    assert nbytes(others) == 4 * x.numel()
    assert all(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for t in others)


def test_exact_steps_save_x_itself():
    model = hot_copy(wrap(nn.Linear(48, 32)), PAPER.replace(exact_steps=1))
    x = torch.randn(256, 48, requires_grad=True)
    y, others, _ = saved_by_forward(model, x)
    assert len(others) == 1 and others[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert nbytes(others) == 4 * x.numel()
    y.sum().backward()
    # After the exact step the compressed copy is saved instead.
    _, others, _ = saved_by_forward(model, x)
    assert nbytes(others) == _abc_bytes(256, 48)


def test_exact_config_saves_the_full_rank_transform():
    """HOTConfig.exact() is not exact_steps: it runs the transforms without quantization, so it
    saves T x in float32, as large as x when L is a multiple of 16 (and never x itself)."""
    model = hot_copy(wrap(nn.Linear(48, 32)), hot.HOTConfig.exact())
    x = torch.randn(256, 48, requires_grad=True)
    _, others, _ = saved_by_forward(model, x)
    big = [t for t in others if t.numel() > 48]
    assert len(big) == 1 and big[0].dtype == torch.float32 and big[0].shape == (48, 256)
    assert big[0].untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


@pytest.mark.parametrize("k", [1, 3])
def test_conv_saves_the_compressed_patches(k):
    """Conv2d: tokens are the B * Ho * Wo output positions and features the C * k * k patch
    entries, so the copy is C k^2 (L/16 * 8) bytes: 1/8 of the fp32 input for 1x1 kernels but
    k^2 / 8 of it for k x k kernels (9/8 for 3x3: ABC is larger than the input there)."""
    torch.manual_seed(0)
    c, hw, b = 8, 8, 4
    model = hot_copy(wrap(nn.Conv2d(c, 16, k, padding=k // 2)), PAPER)
    x = torch.randn(b, c, hw, hw, requires_grad=True)
    _, others, _ = saved_by_forward(model, x)
    assert nbytes(others) == _abc_bytes(b * hw * hw, c * k * k)
    ratio = nbytes(others) / (4 * x.numel())
    assert ratio == pytest.approx(k * k / 8 + k * k / (b * hw * hw), abs=1e-12)
    _, plain, _ = saved_by_forward(wrap(nn.Conv2d(c, 16, k, padding=k // 2)), x)
    assert nbytes(plain) == 4 * x.numel()


def test_frozen_weight_saves_no_abc_copy_and_input_without_grad_no_weight():
    torch.manual_seed(0)
    lin = nn.Linear(48, 32)
    lin.weight.requires_grad_(False)
    lin.bias.requires_grad_(False)
    model = hot_copy(wrap(lin), PAPER)
    x = torch.randn(64, 48, requires_grad=True)
    _, others, params = saved_by_forward(model, x)
    assert others == [] and len(params) == 1  # only W, for g_x

    model = hot_copy(wrap(nn.Linear(48, 32)), PAPER)
    _, others, params = saved_by_forward(model, torch.randn(64, 48))  # x needs no grad
    assert params == [] and nbytes(others) == _abc_bytes(64, 48)


def test_a_drawn_selection_also_keeps_its_step():
    """HOTConfig()'s selection on a Linear layer draws the rows from the layer's seed and step:
    the forward keeps the same codes and scales as the low-pass rows plus a one-element int64
    copy of the step counter (8 bytes), so that backward draws g_y's rows alike."""
    torch.manual_seed(0)
    model = hot_copy(wrap(nn.Linear(48, 32)), hot.HOTConfig())
    assert model[0].hot_run_config.hla.selection == "stratified"
    x = torch.randn(4, 64, 48, requires_grad=True)
    _, others, _ = saved_by_forward(model, x)
    steps = [t for t in others if t.dtype == torch.int64]
    assert [t.numel() for t in steps] == [1]
    assert nbytes(others) == _abc_bytes(256, 48) + 8
