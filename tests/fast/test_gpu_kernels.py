"""GPU tests of the fast backend (run on an H100/H200: pytest -m gpu tests/fast)."""

from __future__ import annotations

import pytest
import torch
from _fast_diff import check_codes, hla_args, hq_args

from hot.common import quant
from hot.common.options import Arch, override
from hot.common.transforms import hla_transform, hq_transform
from hot.fast import gemm
from hot.fast import quantize as fq
from hot.reference import ops as ref

pytestmark = pytest.mark.gpu


def _x(r, c, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(r, c, device="cuda", generator=g)
    x[: r // 7] *= 20
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(4133, 777), (1000, 2304), (25216, 768)])
@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_fused_pass_matches_reference_on_gpu(dtype, shape, mode):
    x = _x(*shape, dtype, 1)
    hq, hla = hq_args(4, mode, True, 5), hla_args(8, "lowpass", 8, "row", True, 6)
    (q1, s1), (q2, s2) = fq.gy_quantize(x, hq, hla)
    with quant.hash_rng():
        qr, sr = ref.hq_quantize(x, hq)
        hr, shr = ref.hla_quantize(x, hla)
    n1 = check_codes(q1, s1, qr, sr, hq_transform(x), 4, True, 5)
    xmax = x.float().abs().amax(0).cpu().reshape(-1, 1)
    n2 = check_codes(q2, s2, hr, shr, hla_transform(x, 8, "lowpass"), 8, True, 6,
                     tol=2.0**-23 * (64 * xmax / shr.cpu() + 2 * 127))
    print(f"flips: hq {n1}, hla {n2}")


def _codes(m, k, lim, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-lim, lim + 1, (m, k), device="cuda", dtype=torch.int8, generator=g)


@pytest.mark.parametrize("mnk", [(25216, 768, 2304), (2304, 768, 12608), (333, 1000, 4096),
                                 (4096, 6144, 2048), (100, 50, 48)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gemm_exact_on_gpu(mnk, out_dtype):
    m, n, k = mnk
    a, b = _codes(m, k, 127, 1), _codes(n, k, 127, 2)
    sa = torch.rand(m, 1, device="cuda") + 0.1
    sb = torch.rand(n, 1, device="cuda") + 0.1
    y = gemm.int_gemm_nt(a, b, sa, sb, out_dtype)
    yr = ref.int_gemm_nt(a, b, sa, sb, out_dtype)
    assert torch.equal(y, yr), (gemm.gemm_path(a, b), (y.float() - yr.float()).abs().max())
    yt = gemm.triton_int8_gemm_nt(a, b, sa, sb, out_dtype)
    assert torch.equal(yt, yr)


@pytest.mark.parametrize("mnk", [(4096, 2304, 768), (333, 1000, 4096), (100, 50, 48)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemm_with_bias_exact_on_gpu(mnk, out_dtype):
    """int_gemm_nt with a bias, on the path it picks (CUTLASS where built, else Triton) and on
    the Triton kernel compiled (bfloat16 rounds to nearest there, unlike the interpreter),
    against the reference bit for bit; N = 1000 and 50 leave partial tiles."""
    m, n, k = mnk
    a, b = _codes(m, k, 127, 3), _codes(n, k, 127, 4)
    sa = (torch.rand(m, 1, device="cuda") + 0.1) * 1e-3
    sb = (torch.rand(n, 1, device="cuda") + 0.1) * 1e-3
    bias = (torch.randn(n, device="cuda") * 4).to(out_dtype).to(torch.float32)
    yr = ref.int_gemm_nt(a, b, sa, sb, out_dtype, bias=bias)
    y = gemm.int_gemm_nt(a, b, sa, sb, out_dtype, bias=bias)
    assert torch.equal(y, yr), (gemm.gemm_path(a, b), (y.float() - yr.float()).abs().max())
    yt = gemm.triton_int8_gemm_nt(a, b, sa, sb, out_dtype, bias=bias)
    assert torch.equal(yt, yr)


def test_gemm_int32_overflow_is_split():
    # 140000 * 127^2 = 2.26e9 > 2^31: a single int32 accumulator would wrap.
    k = 140000
    a = torch.full((64, k), 127, dtype=torch.int8, device="cuda")
    b = torch.full((48, k), 127, dtype=torch.int8, device="cuda")
    a[:, :5] = -3
    s = torch.ones(64, 1, device="cuda")
    y = gemm.int_gemm_nt(a, b, s, torch.ones(48, 1, device="cuda"), torch.float32)
    exact = float((k - 5) * 127 * 127 - 5 * 3 * 127)
    assert torch.equal(y, torch.full_like(y, exact))


def test_ampere_path_forced():
    """HOT_FAST_ARCH=sm80 runs the Ampere kernels on Hopper (int4 tagged codes -> s4 GEMM)."""
    with override(fast_arch=Arch.SM80):
        x = _x(4096, 1024, torch.bfloat16, 3)
        w = _x(512, 1024, torch.bfloat16, 4)
        qg, sg = fq.hq_quantize(x, hq_args(4, "row", True, 1))
        qw, sw = fq.hq_quantize(w, hq_args(4, "row", True, 2))
        path = gemm.gemm_path(qg, qw)
        y = gemm.int_gemm_nt(qg, qw, sg, sw, torch.bfloat16)
    assert torch.equal(y, ref.int_gemm_nt(qg, qw, sg, sw, torch.bfloat16)), path
    print("forced sm80 path:", path)


def test_hot_linear_fast_matches_reference():
    import hot

    torch.manual_seed(0)
    grads = {}
    for backend in ("reference", "fast"):
        lin = torch.nn.Linear(768, 2304, device="cuda", dtype=torch.bfloat16)
        torch.manual_seed(1)
        with torch.no_grad():
            lin.weight.normal_(0, 0.03)
        layer = hot.convert(torch.nn.Sequential(lin), hot.HOTConfig(seed=3), backend=backend)[0]
        x = _x(4000, 768, torch.bfloat16, 7).requires_grad_()
        with quant.hash_rng():
            y = layer(x)
            g = _x(4000, 2304, torch.bfloat16, 8)
            gx, gw = torch.autograd.grad(y, (x, layer.weight), g)
        grads[backend] = (gx.float(), gw.float())
    for a, b in zip(grads["fast"], grads["reference"]):
        # Same codes except rare boundary flips (tested above); a flip moves one product term by
        # one step, so the relative difference stays far below the quantization noise (~0.1).
        rel = ((a - b).norm() / b.norm()).item()
        assert rel < 1e-3, rel
