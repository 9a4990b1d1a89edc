"""A layer whose g_y is large (an LM's output layer) quantizes g_y for its two backward paths in
two passes, freeing g_x's codes before g_W's are formed (hot.nn.backward.splits_gy_pass): the
same gradients as the one pass, bit for bit, on both backends, with less memory at its peak.

Equality is exact because gy_quantize is by definition the pair (hq_quantize, hla_quantize) with
the same arguments (hot.common.ops; the fast fused pass is tested equal to the two operations in
tests/fast/test_quant_interp.py); any change of seed, step or scale between the two routes would
move stochastic-rounding codes and the gradients by a quantization step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot
from hot.common import ops
from hot.nn import backward as hb
from hot_testing import step_grads

CFG = hot.HOTConfig(seed=5)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 80, bias=True))


def _grads(backend: str, split: bool, monkeypatch, xs):
    monkeypatch.setattr(hb, "SPLIT_GY_CODES", 1 if split else 1 << 62)
    m = hot.convert(copy.deepcopy(_model()), CFG, backend=backend).to(xs[0].device)
    return step_grads(m, m, xs)


# the fast backend's layers run on a GPU only (its kernels' CPU tests use the interpreter)
@pytest.mark.parametrize("backend", ["reference", pytest.param("fast", marks=pytest.mark.gpu)])
def test_two_passes_give_the_one_pass_gradients(backend, monkeypatch):
    g = torch.Generator().manual_seed(1)
    dev = "cuda" if backend == "fast" else "cpu"
    xs = [torch.randn(2, 24, 32, generator=g).to(dev) for _ in range(2)]
    one = _grads(backend, False, monkeypatch, xs)

    def refuse(*_a, **_k):
        raise AssertionError("the split backward ran the one g_y pass")

    # the split route runs neither the one-call backward nor the fused g_y pass
    monkeypatch.setattr(ops, "layer_backward", refuse)
    monkeypatch.setattr(ops, "gy_quantize", refuse)
    two = _grads(backend, True, monkeypatch, xs)
    for step, (a, b) in enumerate(zip(one, two)):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: {k} differs by {(a[k] - b[k]).abs().max()}"


def test_only_output_layer_sized_g_y_is_split():
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    assert hb.splits_gy_pass(meta(32768, 32000))  # Llama-1b's output layer, 16 x 2048 tokens
    assert hb.splits_gy_pass(meta(16384, 128256))  # a 128k vocabulary
    assert not hb.splits_gy_pass(meta(32768, 8192))  # its gate / up projections
    assert not hb.splits_gy_pass(meta(32768, 14336))  # Llama-8B's at 32k tokens
    assert not hb.splits_gy_pass(meta(25216, 3072))  # ViT-B/16's fc1 at batch 128


@pytest.mark.gpu
def test_two_passes_lower_the_backward_peak_on_a_gpu(monkeypatch):
    """An output-layer shape (8192 tokens, 1024 -> 65536): the one pass holds g_y's HQ codes
    (512 MiB) and HLA codes (256 MiB at rank 8) together; two passes never hold the HLA codes
    beside the HQ codes, so the backward's peak falls by at least the HLA codes' 256 MiB."""
    dev = torch.device("cuda")
    peaks = {}
    for split in (False, True):
        monkeypatch.setattr(hb, "SPLIT_GY_CODES", 1 if split else 1 << 62)
        torch.manual_seed(0)
        m = hot.convert(nn.Linear(1024, 65536, bias=False), CFG, backend="fast").to(dev)
        x = torch.randn(8192, 1024, device=dev, dtype=torch.bfloat16, requires_grad=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        gy = torch.randn_like(y)
        y.backward(gy)  # the first call registers the pass plans; measure the second
        m.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = m(x)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y.backward(gy)
        torch.cuda.synchronize()
        peaks[split] = torch.cuda.max_memory_allocated() - base
        del m, x, y, gy
        torch.cuda.empty_cache()
    hla_codes = 65536 * 8192 // 2
    assert peaks[False] - peaks[True] >= hla_codes, peaks
