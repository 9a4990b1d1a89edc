"""A layer whose g_y is large (an LM's output layer) quantizes g_y for its two backward paths
apart and in chunks (hot.nn.backward.split_backward): g_x's codes over chunks of tokens, then
g_W's over chunks of output channels, each chunk freed before the next, so the backward's peak
holds one chunk's codes instead of the whole g_y's.

A chunk is quantized as a tensor of its own with its own seed (chunk_seed). Per-token HQ scales
and per-channel HLA scales cover whole rows (columns), so they are the whole g_y's; the
stochastic codes of chunk 0 are the one pass's (same seed, same indices), those of later chunks
their own. So: with nearest rounding the split is the one pass bit for bit; with stochastic
rounding its first chunk is, and the rest differ; and the chunked estimator stays unbiased
(Monte-Carlo, as tests/nn/test_unbiased_hla.py)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot
from hot.common import ops
from hot.nn import backward as hb
from hot_testing import step_grads

CFG = hot.HOTConfig(seed=5, hq=hot.HQConfig(gy_scale="token"))
NEAREST = hot.HOTConfig(seed=5, hq=hot.HQConfig(gy_scale="token", gy_rounding="nearest",
                                                w_rounding="nearest"),
                        hla=hot.HLAConfig(rounding="nearest"))
TOKENS, CIN, COUT = 256, 32, 160
# chunks of 64 tokens for g_x (64 x 160 one-byte codes) and, with 256 / 16 * 8 = 128 HLA
# coefficients per channel, of 64 channels for g_W: 4 and 3 chunks
SMALL_CHUNKS = 64 * COUT


def _split(monkeypatch, split: bool):
    monkeypatch.setattr(hb, "SPLIT_GY_CODES", 1 if split else 1 << 62)
    monkeypatch.setattr(hb, "CHUNK_CODES_GX", SMALL_CHUNKS)
    monkeypatch.setattr(hb, "CHUNK_CODES_GW", SMALL_CHUNKS)


def _model():
    # No bias on the split layer: the fast one-call backward sums g_b in its stats kernel, the
    # split as g_y.sum(0), the same sum in another order (docs/algorithm.md §8), which is not
    # what these tests are about.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 80, bias=False))


def _grads(cfg, backend: str, split: bool, monkeypatch, xs):
    _split(monkeypatch, split)
    m = hot.convert(copy.deepcopy(_model()), cfg, backend=backend).to(xs[0].device)
    return step_grads(m, m, xs)


def _refuse_one_pass(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("the split backward ran the one g_y pass")

    # the split route runs neither the one-call backward nor the fused g_y pass
    monkeypatch.setattr(ops, "layer_backward", refuse)
    monkeypatch.setattr(ops, "gy_quantize", refuse)


# the fast backend's layers run on a GPU only (its kernels' CPU tests use the interpreter)
@pytest.mark.parametrize("backend", ["reference", pytest.param("fast", marks=pytest.mark.gpu)])
def test_split_with_nearest_rounding_is_the_one_pass(backend, monkeypatch):
    g = torch.Generator().manual_seed(1)
    dev = "cuda" if backend == "fast" else "cpu"
    xs = [torch.randn(2, 96, 32, generator=g).to(dev) for _ in range(2)]
    one = _grads(NEAREST, backend, False, monkeypatch, xs)
    _refuse_one_pass(monkeypatch)
    two = _grads(NEAREST, backend, True, monkeypatch, xs)
    for step, (a, b) in enumerate(zip(one, two)):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: {k} differs by {(a[k] - b[k]).abs().max()}"


def _layer_grads(backend: str, split: bool, monkeypatch, x, gy):
    """(g_x, g_W) of one HOT Linear (CIN -> COUT) on x, g_y: a fresh layer, so its seeds are
    the same on both routes."""
    _split(monkeypatch, split)
    torch.manual_seed(0)
    layer = hot.convert(nn.Linear(CIN, COUT, bias=False), CFG, backend=backend).to(x.device)
    x = x.clone().requires_grad_(True)
    layer(x).backward(gy)
    return x.grad, layer.weight.grad


@pytest.mark.parametrize("backend", ["reference", pytest.param("fast", marks=pytest.mark.gpu)])
def test_split_first_chunk_is_the_one_pass_later_chunks_round_their_own(backend, monkeypatch):
    dev = "cuda" if backend == "fast" else "cpu"
    g = torch.Generator().manual_seed(2)
    x = torch.randn(TOKENS, CIN, generator=g).to(dev)
    gy = torch.randn(TOKENS, COUT, generator=g).to(dev)
    gx1, gw1 = _layer_grads(backend, False, monkeypatch, x, gy)
    gx2, gw2 = _layer_grads(backend, True, monkeypatch, x, gy)
    assert (hb.chunks(TOKENS, COUT, hb.CHUNK_CODES_GX)[0] == (0, 64)
            and hb.chunks(COUT, TOKENS // 2, hb.CHUNK_CODES_GW)[0] == (0, 64))
    assert torch.equal(gx1[:64], gx2[:64]) and torch.equal(gw1[:64], gw2[:64])
    # every later chunk differs somewhere (its own random numbers), and only by rounding
    for a, b in ((64, 128), (128, 192), (192, 256)):
        assert not torch.equal(gx1[a:b], gx2[a:b]), (a, b)
    for a, b in ((64, 128), (128, 160)):
        assert not torch.equal(gw1[a:b], gw2[a:b]), (a, b)
    for one, two in ((gx1, gx2), (gw1, gw2)):
        assert (one - two).norm() < 0.2 * one.norm()
    # chunks round with different numbers: g_y's second chunk of tokens made equal to its
    # first gives different g_x rows (per-token scales: the same values, other codes)
    gy[64:128] = gy[:64]
    gx3, _ = _layer_grads(backend, True, monkeypatch, x, gy)
    assert not torch.equal(gx3[:64], gx3[64:128])


N_SMALL, N_LARGE = 16, 256


def _split_errors(monkeypatch, cfg) -> dict:
    """Monte-Carlo over N_LARGE backward calls of one layer (chunked split, reference backend)
    on fixed x (smooth along the tokens) and g_y (white): {path: (squared error of the mean of
    N_SMALL calls, of all N_LARGE, the per-call variance s2 (trace))}."""
    _split(monkeypatch, True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(TOKENS, CIN, generator=g).cumsum(0) / TOKENS ** 0.5
    gy = torch.randn(TOKENS, COUT, generator=g)
    torch.manual_seed(0)
    layer = hot.convert(nn.Linear(CIN, COUT, bias=False), cfg, backend="reference")
    w = layer.weight.detach().double()
    exact = {"g_x": gy.double() @ w, "g_W": gy.t().double() @ x.double()}
    draws = {"g_x": [], "g_W": []}
    for _ in range(N_LARGE):
        xi = x.clone().requires_grad_(True)
        layer.weight.grad = None
        layer(xi).backward(gy)
        draws["g_x"].append(xi.grad.double())
        draws["g_W"].append(layer.weight.grad.double().clone())
    out = {}
    for k, d in draws.items():
        d = torch.stack(d)
        out[k] = (float((d[:N_SMALL].mean(0) - exact[k]).pow(2).sum()),
                  float((d.mean(0) - exact[k]).pow(2).sum()),
                  float((d - d.mean(0)).pow(2).sum((1, 2)).mean()))
    return out


def test_split_is_unbiased(monkeypatch):
    """Each call rounds and draws anew, so for an unbiased estimator the squared error of the
    mean of n calls has expectation s2 / n; assert below 3 s2 / n for n = 256 and a fall like
    1/sqrt(n): the error of 16 calls at least 2.5 times that of 256 (4 expected), for g_x and
    g_W alike (test_unbiased_hla.py's bounds)."""
    for k, (e_small, e_large, s2) in _split_errors(monkeypatch, CFG).items():
        assert e_large <= 3 * s2 / N_LARGE, (k, e_large, s2 / N_LARGE)
        assert (e_small / e_large) ** 0.5 >= 2.5, (k, e_small, e_large)


def test_split_with_the_papers_lowpass_rows_is_biased(monkeypatch):
    """The same test fails for g_W on the paper's fixed low-pass rows (their bias does not
    average out: white g_y loses about half its energy), so it can tell."""
    cfg = CFG.replace(hla={"selection": "lowpass"})
    e_small, e_large, s2 = _split_errors(monkeypatch, cfg)["g_W"]
    assert e_large > 3 * s2 / N_LARGE and (e_small / e_large) ** 0.5 < 2.5, (e_large, s2)


def test_chunks_cover_with_tile_multiples():
    c = hb.chunks(32768, 32000, 1 << 27)  # 128 MiB: 4160 tokens a chunk
    assert c[0] == (0, 4160) and c[-1][1] == 32768
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(c, c[1:]))
    assert all((b - a) % 64 == 0 for a, b in c[:-1])
    assert hb.chunks(100, 1 << 40, 1 << 27) == [(0, 64), (64, 100)]  # at least 64 a chunk
    # Llama-1b's output layer at 32k tokens: 2048 tokens a g_x chunk, and with 16384 HLA
    # coefficients per channel 2048 channels a g_W chunk
    assert hb.chunks(32768, 32000, hb.CHUNK_CODES_GX)[0] == (0, 2048)
    assert hb.chunks(32000, 16384, hb.CHUNK_CODES_GW)[:2] == [(0, 2048), (2048, 4096)]
    assert hb.chunk_seed(7, 0) == 7 and hb.chunk_seed(7, 1) != hb.chunk_seed(7, 2) != 7


def test_only_output_layer_sized_g_y_is_split():
    meta = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    assert hb.splits_gy_pass(meta(32768, 32000))  # Llama-1b's output layer, 16 x 2048 tokens
    assert hb.splits_gy_pass(meta(16384, 128256))  # a 128k vocabulary
    assert not hb.splits_gy_pass(meta(32768, 8192))  # its gate / up projections
    assert not hb.splits_gy_pass(meta(32768, 14336))  # Llama-8B's at 32k tokens
    assert not hb.splits_gy_pass(meta(25216, 3072))  # ViT-B/16's fc1 at batch 128


@pytest.mark.gpu
def test_split_lowers_the_backward_peak_on_a_gpu(monkeypatch):
    """An output-layer shape (8192 tokens, 1024 -> 65536): the one pass holds g_y's HQ codes
    (512 MiB) and HLA codes (256 MiB at rank 8) together; the split holds one chunk's codes
    (at most CHUNK_CODES_GX = 64 MiB) at a time, beside g_x and g_W (16 and 128 MiB), so the
    backward's peak falls by at least 768 - 64 - 16 - 128 = 560 MiB less the quantizers'
    workspaces (well under 100 MiB): at least 448 MiB asserted."""
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
    assert peaks[False] - peaks[True] >= 448 << 20, peaks


def test_split_returns_g_w_in_g_y_dtype(monkeypatch):
    """Under bfloat16 autocast (float32 W, bfloat16 g_y) a split layer returns g_W in g_y's
    dtype (gw_dtype): W.grad is the one pass's float32 g_W rounded to nearest bfloat16, exactly
    (nearest rounding: the two routes' codes are the same), while an unsplit layer keeps W's."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(TOKENS, CIN, generator=g)
    gy = torch.randn(TOKENS, COUT, generator=g).to(torch.bfloat16)

    def weight_grad(split):
        _split(monkeypatch, split)
        torch.manual_seed(0)
        layer = hot.convert(nn.Linear(CIN, COUT, bias=False), NEAREST, backend="reference")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        y.backward(gy)
        return layer.weight.grad

    one, two = weight_grad(False), weight_grad(True)
    assert one.dtype == two.dtype == torch.float32
    assert not torch.equal(one, two)  # the rounding shows
    assert torch.equal(two, one.to(torch.bfloat16).float())
    monkeypatch.undo()  # the library's threshold again
    meta = torch.empty(32768, 32000, dtype=torch.bfloat16, device="meta")
    assert hb.gw_dtype(meta, torch.float32) == torch.bfloat16
    assert hb.gw_dtype(meta[:1024], torch.float32) == torch.float32  # not split
    assert hb.gw_dtype(meta.float(), torch.float32) == torch.float32



def test_layer_bwd_fake_kernel_gives_the_split_g_w_dtype(monkeypatch):
    """hot::layer_bwd's fake kernel (what torch.compile traces) gives the outputs the operator
    returns, g_W's dtype included (gw_dtype), on the arguments of a split layer's backward."""
    from hot.nn import autograd as ag

    seen = {}
    real = ag._layer_bwd

    def spy(*args):
        out = real(*args)
        seen["args"], seen["out"] = args, out
        return out

    monkeypatch.setattr(ag, "_layer_bwd", spy)
    _split(monkeypatch, True)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(TOKENS, CIN, generator=g)
    gy = torch.randn(TOKENS, COUT, generator=g).to(torch.bfloat16)
    layer = hot.convert(nn.Linear(CIN, COUT, bias=False), CFG, backend="reference")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.backward(gy)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in seen["args"]]
    fake = ag._layer_bwd_fake(*meta)
    assert seen["out"][1].dtype == torch.bfloat16  # g_W, before autograd widens it
    for f, r in zip(fake, seen["out"]):
        assert (f.shape, f.dtype) == (r.shape, r.dtype)


def test_split_g_w_dtype_is_the_same_compiled(monkeypatch):
    """Under torch.compile (aot_eager: the same reference kernels) the operator's fake kernel
    gives g_W the dtype the split backward returns (gw_dtype), and W.grad is eager's exactly."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(TOKENS, CIN, generator=g)
    gy = torch.randn(TOKENS, COUT, generator=g).to(torch.bfloat16)
    _split(monkeypatch, True)

    def weight_grad(compiled):
        torch.manual_seed(0)
        layer = hot.convert(nn.Linear(CIN, COUT, bias=False), NEAREST, backend="reference")
        run = torch.compile(layer, backend="aot_eager", fullgraph=True) if compiled else layer
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = run(x)
        y.backward(gy)
        return layer.weight.grad

    eager, comp = weight_grad(False), weight_grad(True)
    assert comp.dtype == torch.float32 and torch.equal(comp, eager)
    torch._dynamo.reset()
