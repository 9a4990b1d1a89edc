"""HOT layers inside CUDA graphs (GPU): a captured training step replays with the seeds of its own
step (they follow the step counter in device memory) and gives the gradients of the same steps
run eagerly, bit for bit; torch.compile(mode="reduce-overhead") trains like the default mode;
capturing a layer whose host-side decisions are not settled raises.

Why equality is the bound: the graph replays the very kernels the eager step launches, with the
same inputs and the same step counter values, and every kernel here is deterministic (the
absmax is an atomic max, the GEMMs sum in a fixed order), so any difference is a wrong seed or
a stale buffer, and moves a gradient by about a quantization step.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(96, 256), nn.GELU(), nn.Linear(256, 64)).cuda()
    return hot.convert(m, hot.HOTConfig(seed=3), backend="fast")


def _batches(n):
    g = torch.Generator(device="cuda").manual_seed(1)
    return [torch.randn(512, 96, device="cuda", generator=g) for _ in range(n)]


def _step(m, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x)
    y.float().square().mean().backward()


def test_captured_step_replays_with_its_own_seeds(ext):
    xs = _batches(6)
    eager, graphed = _model(), _model()
    grads = []
    for x in xs:  # the eager reference: 6 steps
        eager.zero_grad(set_to_none=False)
        _step(eager, x)
        grads.append([p.grad.clone() for p in eager.parameters()])
    # Warm up two steps eagerly (LQS decides; kernels compile and register), then capture.
    for x in xs[:2]:
        graphed.zero_grad(set_to_none=False)
        _step(graphed, x)
    static = xs[2].clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        graphed.zero_grad(set_to_none=False)
        with torch.cuda.graph(g):
            _step(graphed, static)  # capturing runs nothing: step 2 is the first replay
    torch.cuda.current_stream().wait_stream(s)
    for i, x in enumerate(xs[2:], start=2):
        static.copy_(x)
        for p in graphed.parameters():
            p.grad.zero_()
        g.replay()
        torch.cuda.synchronize()
        for a, b in zip(grads[i], graphed.parameters()):
            assert torch.equal(a, b.grad), f"step {i}: {(a - b.grad).abs().max()}"
    assert [int(m.hot_step) for _, m in hot.hot_layers(graphed)] == [6, 6]


def test_capture_during_lqs_calibration_raises(ext):
    m = _model()
    x = _batches(1)[0]
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s), pytest.raises(RuntimeError, match="LQS has not decided"):
        with torch.cuda.graph(g):
            _step(m, x)


def test_reduce_overhead_trains_like_the_default_mode(ext):
    """reduce-overhead first: its warm-up (and LQS's calibration in it) runs in the graphs'
    memory pool, where nothing of HOT's may stay alive (caches made on first use would)."""
    from hot.common import transforms

    transforms._hadamard_cpu.cache_clear()
    xs = _batches(5)
    out = {}
    for mode in ("reduce-overhead", "default"):
        torch._dynamo.reset()
        m = _model()
        f = torch.compile(m, mode=mode)
        losses = []
        for x in xs:
            torch.compiler.cudagraph_mark_step_begin()
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = f(x).float().square().mean()
            loss.backward()
            losses.append(loss.detach().clone())
        out[mode] = (torch.stack(losses), [p.grad.clone() for p in m.parameters()])
    torch._dynamo.reset()
    assert torch.equal(out["default"][0], out["reduce-overhead"][0])
    for a, b in zip(out["default"][1], out["reduce-overhead"][1]):
        assert torch.equal(a, b)
