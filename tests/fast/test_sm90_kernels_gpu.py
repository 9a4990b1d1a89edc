"""Each kernel gemm_s8s8_sm90 picks by the GEMM's shape (csrc/gemm_sm90_s8.cuh: the ping-pong
128x128 tiles with a 1x2 or a 2x1 cluster, the cooperative 128x256 tile, stream-K), with and
without a bias in the epilogue, against exact integer math on the CPU.

Why bitwise equality is the right bound (as in test_csrc_gpu.py): the integer sum is exact, and
the epilogue's float32 products, its float32 bias sum and the one rounding into the output type
run in the order the expected value repeats; IEEE-754 fixes each result. The shapes give odd
counts of tiles along the cluster's axis, where a cluster's second CTA has no tile of its own.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# (M, N, K, the kernel csrc/gemm_sm90_s8.cu picks without a bias, with one) on a 132-SM H100.
CASES = [
    (300, 300, 512, "ping 1x2", "ping 1x2"),      # N <= 1024: 3 x 3 tiles of 128x128
    (4100, 768, 3072, "ping 1x2", "ping 1x2"),    # ViT-B fc2's forward shape class
    (300, 1104, 512, "ping 2x1", "ping 2x1"),     # N > 1024, K <= 1024: 3 x 9 tiles
    (2100, 2100, 2048, "coop", "coop"),           # N > 1024, K > 1024, 153 tiles of 128x256
    (300, 1104, 2048, "stream-K", "coop"),        # 15 tiles of 128x256, K long: stream-K (no bias)
]


def _require_sm90(ext):
    if torch.cuda.get_device_capability() != (9, 0) or not ext.info()["sm90a"]:
        pytest.skip("needs an sm_90a build on a compute capability 9.0 GPU")


def _expected(a, b, sa, sb, bias, dtype):
    # The integer sum exactly (float64, |sum| < 2^53), rounded to float32 as the epilogue
    # converts its int32 accumulator.
    acc = (a.double() @ b.double().t()).to(torch.float32)
    out = (acc * sa) * sb.t()
    if bias is not None:
        out = out + bias
    return out.to(dtype)


@pytest.mark.parametrize("m,n,k,plain,with_bias", CASES)
def test_each_kernel_is_exact_with_and_without_bias(ext, m, n, k, plain, with_bias):
    _require_sm90(ext)
    gen = torch.Generator().manual_seed(m + 7 * n + 13 * k)
    a = torch.randint(-127, 128, (m, k), generator=gen, dtype=torch.int8)
    b = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    sa = (torch.rand((m, 1), generator=gen) * 1.5 + 0.25) * 1e-3
    sb = (torch.rand((n, 1), generator=gen) * 1.5 + 0.25) * 1e-3
    bias = torch.randn(n, generator=gen) * 4
    dev = torch.device("cuda")
    for dtype in DTYPES:
        for bv in (None, bias):
            out = ext.gemm_s8s8_sm90(a.to(dev), b.to(dev), sa.to(dev), sb.to(dev), dtype,
                                     bias=None if bv is None else bv.to(dev))
            exp = _expected(a, b, sa, sb, bv, dtype)
            assert out.shape == (m, n) and out.dtype == dtype
            assert torch.equal(out.cpu(), exp), (
                f"{plain if bv is None else with_bias} M={m} N={n} K={k} {dtype} bias={bv is not None}: "
                f"max |diff| {(out.cpu().double() - exp.double()).abs().max().item()}")


def test_bias_is_added_before_the_one_rounding(ext):
    # A bias that moves the float32 sum across a bfloat16 rounding boundary: adding it after
    # rounding the product gives another value, so this fails if the epilogue rounds twice.
    _require_sm90(ext)
    dev = torch.device("cuda")
    m, n, k = 256, 256, 128
    a = torch.zeros((m, k), dtype=torch.int8)
    b = torch.zeros((n, k), dtype=torch.int8)
    a[:, 0], b[:, 0] = 1, 1  # acc = 1 everywhere
    sa = torch.ones((m, 1))
    p = 1.0 + 2.0 ** -8 - 2.0 ** -12  # just below half a bfloat16 ulp above 1: rounds to 1
    sb = torch.full((n, 1), p)
    bias = torch.full((n,), 2.0 ** -8 - 2.0 ** -12)  # p + bias = 1 + 2^-7 - 2^-11, exact in float32
    out = ext.gemm_s8s8_sm90(a.to(dev), b.to(dev), sa.to(dev), sb.to(dev), torch.bfloat16,
                             bias=bias.to(dev)).cpu()
    once = torch.tensor(1.0 + 2.0 ** -7 - 2.0 ** -11).to(torch.bfloat16)  # 1 + 2^-7
    twice = (torch.tensor(p).to(torch.bfloat16).float() + bias[0]).to(torch.bfloat16)  # 1
    assert once != twice
    assert torch.all(out == once)


def test_bias_errors_name_the_fix(ext):
    _require_sm90(ext)
    dev = torch.device("cuda")
    a = torch.ones((32, 32), dtype=torch.int8, device=dev)
    s = torch.ones((32, 1), device=dev)
    with pytest.raises(ValueError, match=r"bias must have shape \(32,\)"):
        ext.gemm_s8s8_sm90(a, a, s, s, torch.bfloat16, bias=torch.zeros(31, device=dev))
    with pytest.raises(ValueError, match=r"bias must be float32.*bias.float\(\)"):
        ext.gemm_s8s8_sm90(a, a, s, s, torch.bfloat16, bias=torch.zeros(32, device=dev, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bias is on cpu"):
        ext.gemm_s8s8_sm90(a, a, s, s, torch.bfloat16, bias=torch.zeros(32))
