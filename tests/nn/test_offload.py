"""HLAConfig(abc="offload"): the ABC codes wait for backward in pinned host memory
(hot.nn.offload). The codes are the ones "save" forms (same pass, seeds and x), only their
place differs, so the gradients equal "save"'s bit for bit, eagerly and under torch.compile,
with and without sibling layers sharing their input's codes; a wrong entry handed back (another
layer's codes) or a copy read before it landed would move g_W by whole quantization steps.
On a CPU there is nothing to move: "offload" is "save". Under CUDA graphs it raises, naming the
fix."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot
from hot.analysis.saved import SavedTensorMeter
from hot.nn import offload

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Block(nn.Module):
    """Two sibling layers reading one input (q, k), their sum through a third."""

    def __init__(self, d=64):
        super().__init__()
        self.q, self.k, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 32)

    def forward(self, x):
        return self.o(torch.relu(self.q(x)) * self.k(x))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 64), nn.GELU(), Block(), nn.Linear(32, 10))


def _grads(abc: str, device: str, share: str = "none", compiled: bool = False, steps: int = 3):
    cfg = hot.HOTConfig.quantized().replace(seed=3, hla={"abc": abc, "share": share})
    m = hot.convert(copy.deepcopy(_net()), cfg, backend="fast" if device == "cuda"
                    else "reference").to(device)
    f = torch.compile(m) if compiled else m
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(256, 48, generator=g).to(device) for _ in range(steps)]
    out = []
    for x in xs:
        m.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            y = f(x)
        y.float().square().mean().backward()
        out.append({k: p.grad.clone() for k, p in m.named_parameters()})
    return out


def _assert_equal(a, b):
    for step, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), f"step {step}: {k} differs by {(x[k] - y[k]).abs().max()}"


def test_offload_on_a_cpu_is_save():
    _assert_equal(_grads("save", "cpu"), _grads("offload", "cpu"))
    assert offload.pending_entries() == 0


def test_offload_is_a_valid_choice_and_others_are_not():
    assert hot.HLAConfig(abc="offload").abc == "offload"
    with pytest.raises(hot.HOTConfigError, match="HLAConfig.abc"):
        hot.HLAConfig(abc="host")


@gpu
@needs_cuda
@pytest.mark.parametrize("share", ["none", "siblings"])
@pytest.mark.parametrize("compiled", [False, True])
def test_offload_gives_the_save_gradients_on_a_gpu(share, compiled):
    _assert_equal(_grads("save", "cuda", share, compiled), _grads("offload", "cuda", share, compiled))
    torch.cuda.synchronize()
    # entries go with their autograd nodes: after 3 steps of 4 or more entries each, at most
    # the last forward's one may still be held (eagerly by the sibling layers' cache of their
    # shared pass, hot.nn.autograd._shared_x_codes; under compile by the compiled graph)
    assert offload.pending_entries() <= 1


@gpu
@needs_cuda
def test_offloaded_codes_leave_the_gpu():
    """After the forward (copies done), "offload" holds less GPU memory than "save" by the
    codes: rank 8 of 16 int8 codes of every HOT layer's input, (tokens / 2) x in_features
    bytes, 8192 tokens through Linear(1024, 1024) x 4 = 16 MiB; at least 15 MiB asserted (the
    scales, a float per input channel, stay)."""
    torch.manual_seed(0)
    base = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(4)]).cuda()
    x = torch.randn(8192, 1024, device="cuda")
    live = {}
    for abc in ("save", "offload"):
        m = hot.convert(copy.deepcopy(base), hot.HOTConfig(seed=1).replace(hla={"abc": abc}),
                        backend="fast")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            m(x).float().sum().backward()  # plans registered, pinned blocks cached
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16), SavedTensorMeter(m) as meter:
            y = m(x)
        offload.settle()  # every copy out seen done; an allocation lets the allocator free
        torch.empty(1, device="cuda")  # the blocks it kept for them
        live[abc] = torch.cuda.memory_allocated() - before
        host = meter.by_dtype().get("int8 (host)", 0)
        assert host == (16 << 20 if abc == "offload" else 0), meter.by_dtype()
        y.float().sum().backward()
        del m, y
    assert live["save"] - live["offload"] >= 15 << 20, live


@gpu
@needs_cuda
def test_offload_refuses_cuda_graph_capture():
    m = hot.convert(nn.Linear(64, 64).cuda(), hot.HOTConfig(seed=1).replace(hla={"abc": "offload"}),
                    backend="fast")
    x = torch.randn(64, 64, device="cuda")
    m(x).sum().backward()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="abc='save' or 'recompute'"):
            with torch.cuda.graph(g, stream=s):
                m(x)
