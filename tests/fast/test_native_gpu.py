"""Native launches (hot.fast.native, csrc/triton_launch.h) against the Python launches, on a GPU.

Run with `pytest -m gpu tests/fast/test_native_gpu.py` on an H100/H200 (the extension is loaded by
the `ext` fixture of tests/fast/conftest.py). The native path builds the same kernel arguments in
C++ and must give the very same outputs: every code and scale is a deterministic function of the input, the seeds and
the element index, so the expected bound is bitwise equality, not a tolerance.
"""

from __future__ import annotations

import pytest
import torch

from hot.common.options import override
from hot.fast import backward, native, passes
from hot.fast import quantize as fq

from _fast_diff import hla_args, hq_args

pytestmark = pytest.mark.gpu


def _python_pass(x, hq, hla):
    with override(native=False):
        return fq.gy_pass(x, hq, hla)


def _same(a, b, what):
    for i, (u, v) in enumerate(zip(a, b)):
        if u is None or v is None:
            assert u is None and v is None, f"{what}: output {i} present on one path only"
            continue
        assert u.shape == v.shape and u.dtype == v.dtype, f"{what}: output {i} {u.shape} vs {v.shape}"
        assert torch.equal(u, v), f"{what}: output {i} differs in {(u != v).sum().item()} entries"


# (rows, cols, dtype, transposed view): awkward sizes (not multiples of 16 or of the tile), a
# ViT-like g_y, and W^T views in fp32 and bf16 (strided x).
CASES = [(300, 200, torch.bfloat16, False), (1037, 771, torch.float16, False),
         (4096, 768, torch.bfloat16, False), (768, 2304, torch.float32, True),
         (129, 48, torch.bfloat16, True)]


@pytest.mark.parametrize("rows,cols,dtype,transposed", CASES)
@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_quant_pass_native_equals_python(ext, rows, cols, dtype, transposed, mode):
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + cols)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float32, generator=g).to(dtype)
    if transposed:
        x = x.t().contiguous().t()
    cases = [(hq_args(4, mode, True, 11), hla_args(8, "lowpass", 8, "row", True, 12)),
             (hq_args(4, mode, True, 13), None), (None, hla_args(8, "lowpass", 8, mode, True, 14))]
    for hq, hla in cases:
        want = _python_pass(x, hq, hla)
        fq.gy_pass(x, hq, hla)  # the first pass of a plan launches in Python and registers it
        p = passes.plan_for(x, hq, hla)
        assert native.plan(p, x), f"not registered: {native.why_off()}"
        got = fq.gy_pass(x, hq, hla)  # native now
        _same(got, want, f"{tuple(x.shape)} {dtype} hq={hq} hla={hla}")


def test_registration_checks_the_cubin(ext):
    """A kind list that disagrees with the cubin's parameters is refused (cuFuncGetParamInfo):
    one extra pointer, and an int64 in place of an int32."""
    x = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    hq = hq_args(4, "row", True, 1)
    fq.gy_pass(x, hq, None)
    p = passes.plan_for(x, hq, None)
    ks = native._COMPILED[(p.uid, True)][1]  # (per-row HQ alone: a rows plan, no stats kernel)
    kinds = native.kinds_of(ks.src.signature)
    mod = ext.load()
    block, shared = 32 * ks.metadata.num_warps, ks.metadata.shared
    _, err = mod.register_triton(int(ks.function), block, shared, kinds)
    assert err == "", err
    _, err = mod.register_triton(int(ks.function), block, shared, kinds + "p")
    assert "parameters, expected" in err, err
    i = kinds.index("i")
    _, err = mod.register_triton(int(ks.function), block, shared, kinds[:i] + "l" + kinds[i + 1:])
    assert "bytes, expected" in err, err


@pytest.mark.parametrize("gdt,wdt", [(torch.bfloat16, torch.float32), (torch.float16, torch.float16)])
@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_layer_backward_equals_composed(ext, gdt, wdt, mode):
    """layer_backward is by definition the composition of the operations (hot.common.ops)."""
    from hot.common.ops import Quantized
    from hot.fast import gemm

    L, O, I = 1056, 384, 272  # L / 16 * 8 = 528 codes per row of the HLA operands: K % 16 == 0
    g = torch.Generator(device="cuda").manual_seed(5)
    gy = torch.randn(L, O, device="cuda", generator=g).to(gdt)
    w = torch.randn(O, I, device="cuda", generator=g).to(wdt)
    x = torch.randn(L, I, device="cuda", generator=g).to(gdt)
    hla = hla_args(8, "lowpass", 8, "row", True, 21)
    codes = fq.hla_quantize(x, hla._replace(seed=22))
    qx, sx = codes
    hq, hq_w = hq_args(4, mode, True, 23), hq_args(4, "row", True, 24)
    args = (gy, w.t(), codes, hq, hla, hq_w, gdt, wdt)
    # The composed operations, with native launches off (then layer_backward declines).
    with override(native=False):
        assert backward.layer_backward(*args, False) is None
        (q1, s1), (q2, s2) = fq.gy_quantize(gy, hq, hla)
        qw, sw = fq.hq_quantize(w.t(), hq_w)
        want = (gemm.int_gemm_nt(q1, qw, s1, sw, gdt), gemm.int_gemm_nt(q2, qx, s2, sx, wdt))
    # The first call launches both pass plans in Python (registering them) and composes the
    # GEMMs; later calls are one C++ call.
    first = backward.layer_backward(*args, False)
    before = native.CALLS["layer_backward"]
    out = backward.layer_backward(*args, False)
    assert out is not None and native.CALLS["layer_backward"] == before + 1, \
        f"layer_backward did not run natively: {native.why_off()}"
    assert out.gb is None and first.gb is None  # no bias gradient asked for
    _same(first[:2], want, "layer_backward, Python launches")
    # With the bias gradient: the first call launches the bsum plan in Python (registering it),
    # the second is one C++ call; both give the composed g_x and g_W, and the same g_b bits
    # (the same stats-kernel partial sums, summed by the same ATen op).
    first = backward.layer_backward(*args, True)
    second = backward.layer_backward(*args, True)
    assert native.CALLS["layer_backward"] == before + 2
    _same(first[:2], want, "layer_backward need_gb, Python launches")
    _same(second, first, "layer_backward need_gb, native vs Python launches")
    exact = gy.double().sum(0)
    # float32 sums of 1056 terms (relative error <= 1056 * 2^-24 of sum |g|, ~6e-5) rounded once
    # to gdt: within one ulp of gdt (2^-7 relative for bf16, 2^-10 for fp16) plus that sum error.
    ulp = 2.0**-7 if gdt == torch.bfloat16 else 2.0**-10
    bound = ulp * exact.abs() + 1056 * 2.0**-24 * gy.double().abs().sum(0)
    assert second.gb.dtype == gdt and bool(((second.gb.double() - exact).abs() <= bound).all())
    _same(out[:2], want, f"layer_backward {gdt} {wdt} {mode}")
    # L = 1040 gives K = 520 for g_W, which int_gemm_nt runs on the Triton GEMM (CUTLASS needs
    # K % 16 == 0): not one native call, so layer_backward declines and the caller composes.
    gy2, x2 = gy[:1040], x[:1040]
    codes2 = fq.hla_quantize(x2, hla._replace(seed=22))
    assert gemm.gemm_path(fq.gy_quantize(gy2, hq, hla)[1].q, codes2.q) == "triton_s8"
    assert backward.layer_backward(gy2, w.t(), Quantized(*codes2), hq, hla, hq_w, gdt, wdt,
                                   False) is None


def test_layer_gradients_native_equal_python(ext):
    """A HOTLinear trained for a few steps gives the same gradients with native launches on and
    off (the layer's seeds depend on its step, so both runs start from the same state)."""
    import hot

    def run(enabled):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(), torch.nn.Linear(160, 48)).cuda()
        # Per-token g_y scales forced: LQS would switch the plan once while deciding.
        hot.convert(m, hot.HOTConfig().replace(hq={"gy_scale": "token"}), backend="fast")
        # 8 x 128 tokens: K = 512 for g_W (a multiple of 16, so the CUTLASS GEMMs run); x needs
        # a gradient so that both layers take the fused path (g_x and g_W).
        x = torch.randn(8, 128, 96, device="cuda", requires_grad=True)
        grads = []
        with override(native=enabled):
            for _ in range(3):
                m.zero_grad()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = m(x)
                y.float().square().mean().backward()
                grads.append([p.grad.clone() for p in m.parameters()] + [x.grad.clone()])
                x.grad = None
        return grads

    before = native.CALLS["layer_backward"]
    on = run(True)
    # 2 layers x 3 steps; the first backward of each layer registers its plans in Python.
    assert native.CALLS["layer_backward"] - before >= 4, f"not native: {native.why_off()}"
    off = run(False)
    names = [n for n, _ in torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.GELU(),
                                               torch.nn.Linear(160, 48)).named_parameters()] + ["x"]
    for s, (a, b) in enumerate(zip(on, off)):
        for n, u, v in zip(names, a, b):
            if n.endswith("bias"):
                # Native: float32 sums of the bf16 g_y formed by the stats kernel; off: sum(0).
                # Both are float32 sums of the same values (relative difference ~n * 2^-24,
                # far below bf16's 2^-8) rounded once to bf16: at most one bf16 ulp apart,
                # 2^-7 relative.
                torch.testing.assert_close(u, v, rtol=2.0**-7, atol=1e-30, msg=f"step {s} {n}")
            else:
                assert torch.equal(u, v), f"step {s} {n}: {(u != v).sum().item()} entries differ"


def test_failed_registration_falls_back_and_says_why(ext, monkeypatch):
    """A kernel the cubin check refuses (here: an int64 where the cubin has an int32, as a Triton
    with another calling convention could produce) leaves the plan on the Python launches, with
    the reason in why_off(), and the outputs unchanged."""
    x = torch.randn(200, 96, device="cuda", dtype=torch.bfloat16)
    hq, hla = hq_args(4, "row", True, 31), hla_args(8, "lowpass", 8, "row", True, 32)
    want = _python_pass(x, hq, hla)
    with monkeypatch.context() as m:
        m.setattr(native, "_PLANS", {})
        m.setattr(native, "_COMPILED", {})
        m.setattr(native, "_STATE", {})
        real = native.kinds_of
        m.setattr(native, "kinds_of", lambda sig: real(sig).replace("i", "l", 1))
        before = native.CALLS["quant_pass"]
        fq.gy_pass(x, hq, hla)  # launches in Python, tries to register, is refused
        got = fq.gy_pass(x, hq, hla)
        assert native.CALLS["quant_pass"] == before, "a refused plan ran natively"
        why = native.why_off()
        assert why is not None and "registration failed" in why and "bytes, expected" in why, why
        p = passes.plan_for(x, hq, hla)
        assert native._PLANS.get((p.uid, True)) is False
    _same(got, want, "fallback after a refused registration")
