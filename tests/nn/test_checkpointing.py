"""HOT layers under activation checkpointing (torch.utils.checkpoint, as HF's
gradient_checkpointing_enable uses): the forward runs twice, the backward once. With a seeded
config the re-run forward draws the same ABC seed (seeds depend on the layer's step, which only
backward advances), so the gradients equal those of the same model without checkpointing, bit for
bit; a second seed draw, a double step or lost codes would move g_W by a quantization step."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import hot


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(32), nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Block() for _ in range(2)])
        self.ckpt = None  # None: no checkpointing; else use_reentrant

    def forward(self, x):
        for b in self.blocks:
            x = b(x) if self.ckpt is None else checkpoint(b, x, use_reentrant=self.ckpt)
        return x


@pytest.mark.parametrize("abc", ["save", "auto"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_blocks_give_the_same_gradients(abc, reentrant):
    torch.manual_seed(0)
    base = _Net()
    cfg = hot.HOTConfig(seed=1).replace(hla={"abc": abc})
    runs = []
    for ckpt in (None, reentrant):
        m = hot.convert(copy.deepcopy(base), cfg, backend="reference")
        m.ckpt = ckpt
        g = torch.Generator().manual_seed(2)
        out = []
        for _ in range(2):
            x = torch.randn(4, 16, 32, generator=g, requires_grad=True)
            m.zero_grad(set_to_none=True)
            m(x).square().mean().backward()
            out.append({k: p.grad.clone() for k, p in m.named_parameters()})
        runs.append(out)
        assert [int(layer.hot_step) for _, layer in hot.hot_layers(m)] == [2, 2, 2, 2]
    for step, (a, b) in enumerate(zip(*runs)):
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: {k}"
