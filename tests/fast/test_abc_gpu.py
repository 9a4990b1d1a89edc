"""HLAConfig.abc on the fast backend (GPU): forming the ABC codes in backward ("recompute", and
"auto" where x's producer keeps x) gives the gradients of forming them in forward ("save"), bit
for bit. The codes are a deterministic function of x, the seed and the element index, and both
modes quantize the same x with the same seed, so equality (not a tolerance) is the bound; a wrong
seed or a different x would move g_W by about a quantization step.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()


@pytest.mark.parametrize("abc", ["recompute", "auto"])
@pytest.mark.parametrize("autocast", [False, True])
def test_fast_backward_codes_equal_forward_codes(abc, autocast):
    base = _net()
    g = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(16, 3, 16, 16, device="cuda", generator=g) for _ in range(3)]
    grads = {}
    for mode in ("save", abc):
        cfg = hot.HOTConfig(seed=3).replace(hla={"abc": mode})
        m = hot.convert(copy.deepcopy(base), cfg, backend="fast")
        out = []
        for x in xs:
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                y = m(x)
            y.float().square().mean().backward()
            out.append({k: p.grad.clone() for k, p in m.named_parameters()})
        grads[mode] = out
    for step, (a, b) in enumerate(zip(grads["save"], grads[abc])):
        for k in a:
            assert torch.equal(a[k], b[k]), \
                f"step {step}: {k} differs by {(a[k] - b[k]).abs().max()}"
