"""The fast int_gemm_nt (Triton int8 GEMM with the dequantizing epilogue) against the reference:
exact integer sums, so the results must be bit-identical. With a bias the epilogue adds it in
float32 after the two scale multiplications and before the one rounding into the output dtype,
the reference's order, so those results are bit-identical too."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _fast_diff import DEVICE, hla_args, hq_args

from hot.common import ops
from hot.fast import gemm
from hot.reference import ops as ref


def _codes(shape, lim, g):
    return torch.randint(-lim, lim + 1, shape, generator=g, dtype=torch.int8)


@settings(max_examples=12)  # the interpreter runs each 16x16 tile in numpy (~20 ms each)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 80), st.sampled_from([7, 127]),
       st.booleans(), st.booleans(), st.sampled_from([torch.float32, torch.bfloat16]))
def test_gemm_matches_reference(m, n, k, lim, row_a, row_b, dtype):
    g = torch.Generator().manual_seed(m * 10007 + n * 101 + k)
    a, b = _codes((m, k), lim, g), _codes((n, k), lim, g)
    sa = torch.rand((m if row_a else 1, 1), generator=g) + 0.01
    sb = torch.rand((n if row_b else 1, 1), generator=g) + 0.01
    y = gemm.int_gemm_nt(a.to(DEVICE), b.to(DEVICE), sa.to(DEVICE), sb.to(DEVICE), dtype)
    yr = ref.int_gemm_nt(a, b, sa, sb, dtype)
    assert y.dtype == dtype and y.shape == (m, n)
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        # The Triton interpreter casts fp32 -> bf16 by truncation (GPUs round to nearest, and the
        # GPU run of this test is exact): allow one bf16 ulp (2^-7 relative) only there.
        torch.testing.assert_close(y.float(), yr.float(), rtol=2.0**-7, atol=0)
    else:
        assert torch.equal(y.cpu(), yr)


def test_split_k_chunks_are_exact():
    # A small forced chunk runs the int64 chunk-sum path; extreme codes make every partial large.
    g = torch.Generator().manual_seed(1)
    a = _codes((20, 300), 127, g)
    b = _codes((18, 300), 127, g)
    a[:, :150] = 127
    b[:, :150] = -127
    sa, sb = torch.ones(20, 1), torch.ones(18, 1)
    y = gemm.triton_int8_gemm_nt(a.to(DEVICE), b.to(DEVICE), sa.to(DEVICE), sb.to(DEVICE),
                                 torch.float32, split_k=64)
    assert torch.equal(y.cpu(), ref.int_gemm_nt(a, b, sa, sb, torch.float32))


def test_split_k_threshold():
    # K * 128^2 must stay below 2^31 in one int32 accumulator: 131071 fits, 131072 does not.
    assert gemm.split_k_elems(131071) == 0
    c = gemm.split_k_elems(131072)
    assert c > 0 and c * 128 * 128 < 2**31 and c % 256 == 0


def test_ops_route_to_fast_backend():
    import hot  # noqa: F401  (registers the loader)

    x = torch.randn(20, 24, device=DEVICE)
    q1, s1 = ops.hq_quantize(x, hq_args(4, "row", False, 0), "fast")
    q2, s2 = ops.hq_quantize(x, hq_args(4, "row", False, 0), "reference")
    assert torch.equal(q1.cpu(), q2.cpu()) and torch.equal(s1.cpu(), s2.cpu())
    hq, hla = hq_args(4, "tensor", False, 0), hla_args(8, "lowpass", 8, "row", False, 0)
    out = ops.gy_quantize(x, hq, hla, "reference")
    a = ops.hq_quantize(x, hq, "reference")
    b = ops.hla_quantize(x, hla, "reference")
    for u, v in zip((*out[0], *out[1]), (*a, *b)):
        assert torch.equal(u, v)


def test_small_code_tags_follow_identity_and_version():
    a = gemm.tag_small_codes(torch.zeros(4, 32, dtype=torch.int8))
    b = torch.zeros(4, 32, dtype=torch.int8)
    assert gemm._small(a) and not gemm._small(b)
    a.add_(100)  # an in-place change after tagging: the codes may no longer fit in 4 bits
    assert not gemm._small(a)


# Bit for bit on every device: float32 and float16 (the interpreter rounds fp32 -> fp16 to
# nearest); bfloat16 only compiled, the interpreter truncating it (test_gemm_matches_reference).
_EXACT_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def _on(*ts):
    return [t.to(DEVICE) for t in ts]


@settings(max_examples=10)
@given(st.integers(2, 40), st.integers(2, 40), st.integers(2, 80), st.booleans(), st.booleans(),
       st.sampled_from(_EXACT_DTYPES))
def test_gemm_with_bias_matches_reference(m, n, k, row_a, row_b, dtype):
    g = torch.Generator().manual_seed(m * 10007 + n * 101 + k + 1)
    a, b = _codes((m, k), 127, g), _codes((n, k), 127, g)
    # |out| below 2^10: no float16 overflow
    sa = torch.rand((m if row_a else 1, 1), generator=g) * 1e-2 + 1e-4
    sb = torch.rand((n if row_b else 1, 1), generator=g) * 1e-2 + 1e-4
    bias = (torch.randn(n, generator=g) * 4).to(dtype).to(torch.float32)
    y = gemm.int_gemm_nt(*_on(a, b, sa, sb), dtype, bias=bias.to(DEVICE))
    assert y.dtype == dtype and y.shape == (m, n)
    assert torch.equal(y.cpu(), ref.int_gemm_nt(a, b, sa, sb, dtype, bias=bias))


@pytest.mark.parametrize("dtype", _EXACT_DTYPES)
def test_gemm_bias_is_added_before_the_rounding(dtype):
    """out[0, 0] = (2049 * 2^-11) * 1 = 1 + 2^-11 in float32, a float16 tie between 1 and
    1 + 2^-10 (to even: 1), and bias[0] = -1: the bias added before the rounding gives 2^-11,
    added after it 0. N = 21 leaves a partial 16-column tile (the interpreter's tile)."""
    m, n, k = 19, 21, 32
    g = torch.Generator().manual_seed(4)
    a, b = _codes((m, k), 7, g), _codes((n, k), 7, g)
    a[0], b[0] = 0, 1
    a[0, :16], a[0, 16] = 127, 17  # 16 * 127 + 17 = 2049 against b's row of ones
    sa = torch.rand(m, 1, generator=g) * 1e-2 + 1e-3
    sa[0] = 2.0 ** -11
    sb = torch.rand(n, 1, generator=g) + 0.5
    sb[0] = 1.0
    bias = (torch.randn(n, generator=g) * 2).to(dtype).to(torch.float32)
    bias[0] = -1.0
    y = gemm.int_gemm_nt(*_on(a, b, sa, sb), dtype, bias=bias.to(DEVICE)).cpu()
    assert torch.equal(y, ref.int_gemm_nt(a, b, sa, sb, dtype, bias=bias))
    if dtype == torch.float16:
        assert y[0, 0].item() == 2.0 ** -11
        assert (ref.int_gemm_nt(a, b, sa, sb, dtype)[0, 0] + bias[0].to(dtype)).item() == 0.0


@pytest.mark.parametrize("n", [18, 32])
def test_split_k_chunks_with_bias_add_it_once(n):
    # The int64 chunk-sum path (split_k = 64 of K = 300: five chunks) with a bias: added once,
    # after the whole sum; N = 18 leaves a partial tile, 32 fills two.
    g = torch.Generator().manual_seed(2)
    a, b = _codes((20, 300), 127, g), _codes((n, 300), 127, g)
    a[:, :150] = 127
    b[:, :150] = -127
    sa = torch.rand(20, 1, generator=g) + 0.5
    sb = torch.rand(n, 1, generator=g) + 0.5
    bias = torch.randn(n, generator=g) * 1e5
    y = gemm.triton_int8_gemm_nt(*_on(a, b, sa, sb), torch.float32, split_k=64,
                                 bias=bias.to(DEVICE))
    assert torch.equal(y.cpu(), ref.int_gemm_nt(a, b, sa, sb, torch.float32, bias=bias))
    no_bias = gemm.triton_int8_gemm_nt(*_on(a, b, sa, sb), torch.float32, split_k=64)
    assert not torch.equal(y, no_bias)


def test_ops_hand_the_bias_to_the_fast_backend():
    import hot  # noqa: F401  (registers the loader)

    g = torch.Generator().manual_seed(6)
    for m, n, k in ((24, 40, 64), (1, 40, 64), (24, 1, 64)):  # the last two: the default's
        a, b = _codes((m, k), 127, g), _codes((n, k), 127, g)
        sa, sb = torch.rand(m, 1, generator=g) + 0.1, torch.rand(n, 1, generator=g) + 0.1
        bias = torch.randn(n, generator=g) * 100
        y = ops.int_gemm_nt(*_on(a, b, sa, sb), torch.float32, "fast", bias=bias.to(DEVICE))
        assert torch.equal(y.cpu(), ref.int_gemm_nt(a, b, sa, sb, torch.float32, bias=bias))
