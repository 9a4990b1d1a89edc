"""Layer-level differential test on a GPU: HOTLinear / HOTConv2d with backend='fast' against
backend='reference' (same weights, input, seeds; the reference draws from the kernels' hash
stream inside quant.hash_rng()), plus a short training run with both backends.

How the gradients may differ: both backends call the same operations with the same arguments
(recorded below), and int_gemm_nt is exact in both, so g_x, g_W, g_b are bit-identical unless a
quantizer code flipped (the transforms sum in different orders; a code flips by 1 only at a
rounding boundary, see _fast_diff). One flip changes the exact GEMM result by one code unit times
the two scales: a g_y HQ code (row i, col j) changes g_x[i, :] by sg[i] * qw[:, j] * sw, at most
sg * qmax * sw; a W code likewise. So |dg_x| <= n_flips * qmax * max sg * max sw elementwise (times
kh*kw for a conv, whose fold sums that many patches), plus one rounding of the output dtype
(relative 2^-8 for bf16, 2^-24 for fp32) on both sides. The same holds for g_W with the HLA codes
(qmax 127) of g_y and of the saved x.
"""

from __future__ import annotations

import copy

import pytest
import torch

import hot
from hot.common import ops, quant
from hot.common.options import Tile, override

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

@pytest.fixture(autouse=True, scope="module")
def _one_tile_composed_operations():
    # One fixed quantizer tile: the GPU autotuner compiles all of hot.fast.passes._TILES for every
    # kernel specialization (dtype x scale modes x HQ/HLA switches), which this file hits ~16 of;
    # the tile changes only speed, never the codes. And no native launches: these tests compare
    # the backends operation by operation, so the fast backward must run as the composed
    # operations (its one-call layer_backward bypasses them and is compared with them bit for
    # bit in tests/fast/test_native_gpu.py).
    with override(autotune=False, tile=Tile(64, 64, 4), native=False):
        yield


_OPS = ("hq_quantize", "hla_quantize", "gy_quantize", "int_gemm_nt")


class _Recorder:
    """Wraps the operations of hot.common.ops that a layer's backward calls (hot.nn.backward
    reads them from the module at call time) and records their outputs in order."""

    def __init__(self):
        self.calls = []
        self.orig = {}

    def __enter__(self):
        for name in _OPS:
            orig = self.orig[name] = getattr(ops, name)

            def wrap(*a, _orig=orig, _name=name, **kw):  # kw: int_gemm_nt's bias=
                out = _orig(*a, **kw)
                self.calls.append((_name, out, a))
                return out

            setattr(ops, name, wrap)
        return self

    def __exit__(self, *exc):
        for name, orig in self.orig.items():
            setattr(ops, name, orig)


def _codes_and_scales(calls):
    """[(codes, scale), ...] of every quantizer output, in call order."""
    out = []
    for name, res, _ in calls:
        if name == "int_gemm_nt":
            continue
        out.extend(res if name == "gy_quantize" else [res])
    return out


def _run(layer, x, gy, backend, autocast):
    m = hot.convert(torch.nn.Sequential(copy.deepcopy(layer)), CFG[0], backend=backend)[0]
    xx = x.clone().requires_grad_(True)
    with _Recorder() as rec, quant.hash_rng():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = m(xx)
        y.backward(gy.to(y.dtype))
    return (xx.grad, m.weight.grad, m.bias.grad), rec.calls


CFG = [None, None]


def _flips(calls_f, calls_r):
    """Per quantizer output: (#codes that differ, max relative scale difference)."""
    n = []
    for (qf, sf), (qr, sr) in zip(_codes_and_scales(calls_f), _codes_and_scales(calls_r)):
        assert qf.shape == qr.shape and sf.shape == sr.shape
        fin = torch.isfinite(sr)
        torch.testing.assert_close(sf[fin], sr[fin], rtol=260 * 2.0**-23, atol=0)
        d = (qf.int() - qr.int()).abs()
        assert int(d.max()) <= 1 if d.numel() else True
        k = int((d != 0).sum())
        assert k <= max(1, 1e-3 * d.numel()), f"{k} of {d.numel()} codes flipped"
        n.append((k, float(((sf - sr).abs() / sr.abs()).max())))
    return n


def _gemm_tol(args_f, out_r, nflips, srel, rel):
    """Elementwise bound on |out_fast - out_ref| of one int_gemm_nt call: each flipped code moves
    the exact integer sum by at most max|other code| (times both scales); a scale that differs
    by srel (relative) moves the result by srel * |result| <= srel * (|a| . |b|^T) sa sb; and each
    side rounds once into the output dtype (rel)."""
    from hot.reference import ops as ref

    a, b, sa, sb = args_f[:4]
    absprod = ref.int_gemm_nt(a.abs(), b.abs(), sa.abs(), sb.abs(), torch.float32)
    qmax = max(int(a.abs().max()), int(b.abs().max()))
    flip = nflips * qmax * float(sa.abs().max()) * float(sb.abs().max())
    return flip + 2.01 * srel * absprod + 2 * rel * out_r.abs().float()


@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("lqs", ["token", "tensor"])
def test_layer_fast_equals_reference(kind, autocast, lqs):
    torch.manual_seed(0)
    CFG[0] = hot.HOTConfig(seed=7, hq=hot.HQConfig(gy_scale=lqs))
    CFG[1] = lqs
    if kind == "linear":
        layer = torch.nn.Linear(200, 136).cuda()
        x = torch.randn(3, 170, 200, device="cuda")
        gy = torch.randn(3, 170, 136, device="cuda")
        overlap = 1
    else:
        layer = torch.nn.Conv2d(24, 40, 3, padding=1).cuda()
        x = torch.randn(4, 24, 14, 14, device="cuda")
        gy = torch.randn(4, 40, 14, 14, device="cuda")
        overlap = 9
    gy[0] *= 20  # heavy-tailed tokens: per-token and per-tensor scales differ
    (gxf, gwf, gbf), cf = _run(layer, x, gy, "fast", autocast)
    (gxr, gwr, gbr), cr = _run(layer, x, gy, "reference", autocast)
    assert [c[0] for c in cf] == [c[0] for c in cr], "the backends took different op sequences"
    fl = _flips(cf, cr)
    nflips = sum(k for k, _ in fl)
    srel = max(r for _, r in fl)
    print(f"flips {kind} autocast={autocast} lqs={lqs}: {[k for k, _ in fl]} scale rel diff {srel:.1e}")
    assert torch.equal(gbf, gbr)
    rel = 2.0**-8 if autocast else 2.0**-24
    gemms_f = [c for c in cf if c[0] == "int_gemm_nt"]
    gemms_r = [c for c in cr if c[0] == "int_gemm_nt"]
    assert len(gemms_f) == 2
    tols = []
    for (_, of, af), (_, orr, _) in zip(gemms_f, gemms_r):
        tol = _gemm_tol(af, orr, nflips, srel, rel)
        diff = (of.float() - orr.float()).abs()
        assert (diff <= tol).all(), f"GEMM output differs by {float(diff.max())} (bound {float(tol.max())})"
        if nflips == 0 and srel == 0:
            assert torch.equal(of, orr)
        tols.append(float(tol.max()))
    # The layer's gradients are those GEMM outputs reshaped (linear) or folded (conv: each input
    # pixel sums <= kh*kw patch entries), cast to the parameter/input dtype (one more rounding).
    for a, b, t in ((gxf, gxr, tols[0] * overlap), (gwf, gwr, tols[1])):
        assert torch.isfinite(a).all() and a.dtype == b.dtype and a.shape == b.shape
        d = (a.float() - b.float()).abs()
        assert (d <= t + 2 * rel * b.abs().float()).all(), f"{float(d.max())} > {t}"


def _train(backend, seed, steps=100):
    """A 2-layer MLP (HOT on both layers) on a fixed synthetic 10-class problem; final loss."""
    g = torch.Generator().manual_seed(123)
    x = torch.randn(512, 64, generator=g).cuda()
    w_true = torch.randn(64, 10, generator=g).cuda()
    y = (x @ w_true).argmax(1)
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).cuda()
    hot.convert(m, hot.HOTConfig(seed=seed), backend=backend)
    opt = torch.optim.SGD(m.parameters(), lr=0.2)
    with quant.hash_rng():
        for _ in range(steps):
            loss = torch.nn.functional.cross_entropy(m(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return float(loss)


def test_training_fast_matches_reference():
    """Same seed and hash stream: the two backends follow the same trajectory up to rare flips.
    Bound: the seed-to-seed spread of the final loss (3 seeds of the fast backend) measures how
    far HOT's own noise moves it; a correct fast path must land within 3 of those standard
    deviations (plus 2% for chaos over 100 steps) of the reference with the same seed, while a
    broken one (wrong codes, scales or layout) does not train like the reference at all."""
    fast = [_train("fast", s) for s in (1, 2, 3)]
    ref = _train("reference", 1)
    mean = sum(fast) / 3
    sd = (sum((v - mean) ** 2 for v in fast) / 2) ** 0.5
    print(f"training: fast {fast} reference(seed 1) {ref} sd {sd:.4f}")
    assert abs(fast[0] - ref) <= 3 * sd + 0.02 * ref
    assert fast[0] < 0.5 * 2.303  # it learns: well below chance (ln 10)


@pytest.mark.parametrize("native", [False, True])
def test_quantized_forward_fast(native, forward_error_bound):
    """HOTConfig.quantized() on the fast backend: the output within the forward's rounding bound
    of the exact product (tests/nn/test_quantized_forward.py derives it), as the reference's is,
    and the backward's
    gradients bit for bit those of the exact forward with the same seeds (straight-through)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 80, device="cuda")
    x = torch.randn(130, 96, device="cuda")
    x[::9] *= 30
    gy = torch.randn(130, 80, device="cuda")
    exact = lin(x).detach().double()
    cfg = hot.HOTConfig(seed=4)
    layers = {}
    for name, c, backend in (("q", cfg.quantized().replace(seed=4), "fast"),
                             ("e", cfg, "fast"),
                             ("r", cfg.quantized().replace(seed=4), "reference")):
        layers[name] = hot.convert(copy.deepcopy(lin), c, backend=backend)
    out, grads = {}, {}
    with override(native=native):
        for name, layer in layers.items():
            xi = x.clone().requires_grad_(True)
            y = layer(xi)
            y.backward(gy)
            out[name], grads[name] = y.detach(), (xi.grad, layer.weight.grad, layer.bias.grad)
    bound = forward_error_bound(x.cpu(), lin.weight.detach().cpu()).cuda()
    for name in ("q", "r"):  # (their codes agree up to boundary flips: test_quant_interp)
        err = (out[name].double() - exact).abs()
        assert (err <= bound).all() and err.max() > 0
    for u, v in zip(grads["q"], grads["e"]):
        assert torch.equal(u, v)
