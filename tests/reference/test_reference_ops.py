"""The reference backend's operations against the spec in hot/common/ops.py.

Transforms are checked against dense block-diagonal matrices built with torch.block_diag, in
float64: both sides are sums of at most 16 products of values of order 1 with +-1/4 or
+-1/sqrt(16) entries, so they agree to ~16 ulps; we allow 1e-12 absolute on O(1) data.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import hot  # noqa: F401  (registers the ops and the reference backend)
from hot.common import ops, quant
from hot.common.config import VALID_RANKS
from hot.common.ops import HLAArgs, HQArgs, ScaleMode
from hot.common.transforms import hla_transform, hq_transform
from hot.common.walsh import hadamard16, hla_matrix
from hot.reference import ops as ref

TOL = 1e-12
SELECTIONS = ("lowpass", "lp_l1")


def _pad16(n):
    return -(-n // 16) * 16


def _dense_hq(c):
    """I (x) H16 of size C16 x C16."""
    return torch.block_diag(*[hadamard16()] * (_pad16(c) // 16))


def _dense_hla(length, rank, sel):
    """I (x) T_r of size (L16/16 * r) x L16."""
    return torch.block_diag(*[hla_matrix(rank, sel)] * (_pad16(length) // 16))


def _x(r, c, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(r, c, generator=g, dtype=torch.float64)


@given(r=st.integers(1, 40), c=st.integers(1, 70), seed=st.integers(0, 2**16))
def test_hq_transform_equals_dense_block_product(r, c, seed):
    x = _x(r, c, seed)
    xp = F.pad(x, (0, _pad16(c) - c))  # zero columns up to a multiple of 16
    want = xp @ _dense_hq(c)
    got = hq_transform(x)
    assert got.dtype == torch.float64 and got.shape == (r, _pad16(c))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


@given(length=st.integers(1, 70), c=st.integers(1, 24), rank=st.sampled_from(VALID_RANKS),
       sel=st.sampled_from(SELECTIONS), seed=st.integers(0, 2**16))
def test_hla_transform_equals_dense_block_product(length, c, rank, sel, seed):
    x = _x(length, c, seed)
    xp = F.pad(x, (0, 0, 0, _pad16(length) - length))  # zero token rows
    want = (_dense_hla(length, rank, sel) @ xp).T
    got = hla_transform(x, rank, sel)
    assert got.shape == (c, _pad16(length) // 16 * rank)
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_transforms_keep_float32_for_low_precision_input():
    x = torch.randn(5, 20, dtype=torch.bfloat16)
    assert hq_transform(x).dtype == torch.float32
    assert hla_transform(x, 8, "lowpass").dtype == torch.float32


@pytest.mark.parametrize("scale_mode", ["row", "tensor"])
def test_bits0_means_no_quantization(scale_mode):
    x = _x(20, 33, 0)
    q, s = ops.hq_quantize(x, HQArgs(0, ScaleMode(scale_mode), True, 1), "reference")
    torch.testing.assert_close(q, hq_transform(x), atol=0, rtol=0)
    assert torch.equal(s, torch.ones(20 if scale_mode == "row" else 1, 1))
    q, s = ops.hla_quantize(x, HLAArgs(4, "lp_l1", 0, ScaleMode(scale_mode), True, 1), "reference")
    torch.testing.assert_close(q, hla_transform(x, 4, "lp_l1"), atol=0, rtol=0)
    assert torch.equal(s, torch.ones(33 if scale_mode == "row" else 1, 1))


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("scale_mode", ["row", "tensor"])
@pytest.mark.parametrize("stochastic", [True, False])
def test_quantize_ops_are_transform_then_quantize(bits, scale_mode, stochastic):
    x = _x(19, 37, 1).float()
    q, s = ops.hq_quantize(x, HQArgs(bits, ScaleMode(scale_mode), stochastic, 7), "reference")
    qt, st_ = quant.quantize(hq_transform(x), bits, scale_mode, stochastic, 7)
    assert q.dtype == torch.int8 and torch.equal(q, qt) and torch.equal(s, st_)
    q, s = ops.hla_quantize(x, HLAArgs(8, "lowpass", bits, ScaleMode(scale_mode), stochastic, 7),
                            "reference")
    qt, st_ = quant.quantize(hla_transform(x, 8, "lowpass"), bits, scale_mode, stochastic, 7)
    assert torch.equal(q, qt) and torch.equal(s, st_)
    # Dequantized values are within one step of the transform (half a step for nearest).
    t = hla_transform(x, 8, "lowpass")
    assert ((q.float() * s - t).abs() <= s * (1.0 if stochastic else 0.5) * (1 + 1e-5)).all()


def test_quantize_ops_use_the_hash_stream_when_asked():
    x = _x(16, 32, 2).float()
    a, _ = ops.hq_quantize(x, HQArgs(4, ScaleMode.ROW, True, 5), "reference")
    with quant.hash_rng():
        b, s = ops.hq_quantize(x, HQArgs(4, ScaleMode.ROW, True, 5), "reference")
    # v = t * (1 / s), then v + u and the floor: each a separate float32 operation.
    v = hq_transform(x) * (1 / s)
    u = quant.hash_uniform(5, tuple(v.shape))
    want = torch.clamp(torch.floor(v + u), -7, 7).to(torch.int8)
    assert torch.equal(b, want)
    assert not torch.equal(a, b)


@pytest.mark.parametrize("k", [16, 48, 1200])
def test_int_gemm_nt_is_exact_on_integer_codes(k):
    """k = 1200 with codes of magnitude 127 passes 2^24 (1200 * 127^2 = 1.9e7), where a float32
    accumulator would round; the result must still equal the int64 product."""
    g = torch.Generator().manual_seed(k)
    a = torch.randint(-127, 128, (9, k), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (7, k), generator=g, dtype=torch.int8)
    a[0], b[0] = 127, 127  # the largest possible partial sums
    sa = torch.rand(9, 1, generator=g) + 0.5
    sb = torch.rand(7, 1, generator=g) + 0.5
    exact = a.to(torch.int64) @ b.to(torch.int64).T
    out = ref.int_gemm_nt(a, b, torch.ones(9, 1), torch.ones(7, 1), torch.float64)
    assert torch.equal(out, exact.to(torch.float64))
    out = ref.int_gemm_nt(a, b, sa, sb, torch.float32)
    # (exact integer) * sa * sb in float32: two roundings, relative error <= 2 * 2^-24.
    want = exact.to(torch.float64) * sa.double() * sb.double().T
    torch.testing.assert_close(out.double(), want, rtol=2.5 * 2**-24, atol=0)


_PRODUCTS = {"float32 chunks": ref._int_product_f32,
             # int32 chunks of 1000 here: the real chunk (131071) would need huge test operands
             "int32 chunks": lambda a, b: ref._int_product_i32(a, b, chunk=1000),
             "float64 (CUDA's long contractions)": ref._int_product_f64,
             "dispatch": ref._int_product}


@pytest.mark.parametrize("path", sorted(_PRODUCTS))
@pytest.mark.parametrize("k", [0, 1000, 1001, 1040, 1041, 3200])
def test_int_product_chunks_equal_the_int64_product_rounded_once(k, path):
    """The float path cuts contractions past the float32 bound into chunks of
    (2^24 - 1) // (127 * 127) = 1040 columns: k = 1041 leaves a one-column chunk, 3200 is the demo's
    HLA length; the int32 path (CPU) is checked with 1000-column chunks. Rows of all +127 /
    alternating signs make partial sums reach 5e7 > 2^24, where a single float32 accumulator
    would round; the result must be the int64 product rounded to float32 exactly once."""
    product = _PRODUCTS[path]
    g = torch.Generator().manual_seed(k + 1)
    a = torch.randint(-127, 128, (6, k), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (5, k), generator=g, dtype=torch.int8)
    if k:
        a[0], b[0] = 127, 127
        a[1] = torch.where(torch.arange(k) % 2 == 0, 127, -127).to(torch.int8)
        b[1] = torch.where(torch.arange(k) % 2 == 0, 127, -127).to(torch.int8)
        b[2] = 0
    exact = a.to(torch.int64) @ b.to(torch.int64).T
    got = product(a, b)
    assert got.dtype == torch.float32
    assert torch.equal(got, exact.to(torch.float32))  # int64 -> float32 rounds once, to nearest
    assert torch.equal(product(torch.zeros_like(a), b), torch.zeros(6, 5))


def test_int32_chunk_is_the_overflow_bound():
    # K * 128^2 <= 2^31 - 1 < (K + 1) * 128^2: no int32 sum of a chunk can overflow.
    k = ref._I32_CHUNK
    assert k * 128 * 128 <= 2**31 - 1 < (k + 1) * 128 * 128


def test_int_gemm_nt_float_operands_float64():
    a, b = _x(5, 16, 3), _x(6, 16, 4)
    sa, sb = torch.ones(5, 1), torch.ones(1, 1)
    out = ops.int_gemm_nt(a, b, sa, sb, torch.float64, "reference")
    torch.testing.assert_close(out, a @ b.T, atol=TOL, rtol=0)


def _bias_tie_case():
    """Codes, scales and a bias where the bias must be added before the one rounding: out[0, 0]
    = (257 * 2^-8) * 1 = 1 + 2^-8 exactly in float32, a tie between the bfloat16 neighbours 1
    and 1 + 2^-7 (rounded to even: 1), and bias[0] = -1. Adding the bias to the float32 result
    gives 2^-8 (exact in bfloat16); rounding first and then adding the bias gives 0."""
    a = torch.zeros(2, 16, dtype=torch.int8)
    a[0, :3] = torch.tensor([127, 127, 3], dtype=torch.int8)  # 257 against b's row of ones
    a[1] = torch.arange(-8, 8, dtype=torch.int8)
    b = torch.ones(3, 16, dtype=torch.int8)
    b[1] = -2
    b[2, ::2] = 5
    sa = torch.tensor([[2.0 ** -8], [0.75]])
    sb = torch.tensor([[1.0], [0.3], [1.7]])
    bias = torch.tensor([-1.0, 0.1, -3.3])
    return a, b, sa, sb, bias


def test_int_gemm_nt_adds_the_bias_before_the_one_rounding():
    a, b, sa, sb, bias = _bias_tie_case()
    acc = (a.long() @ b.long().T).to(torch.float32)
    f32 = acc.mul(sa).mul(sb.T)  # the float32 result before the bias
    assert f32[0, 0].item() == 1 + 2 ** -8
    out = ops.int_gemm_nt(a, b, sa, sb, torch.bfloat16, "reference", bias=bias)
    assert torch.equal(out, (f32 + bias).to(torch.bfloat16))
    assert out[0, 0].item() == 2 ** -8
    # the order the bias had when it was added after the GEMM: a different value
    old = f32.to(torch.bfloat16) + bias.to(torch.bfloat16)
    assert old[0, 0].item() == 0.0
    assert torch.equal(ref.int_gemm_nt(a, b, sa, sb, torch.float32, bias=bias), f32 + bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int_gemm_nt_bias_is_float32_then_one_rounding(dtype):
    """Random codes: out = cvt(((float32(acc) * sa) * sb) + bias), each float32 operation
    rounded in this order; bias=None is the result without the addition, bit for bit."""
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-127, 128, (33, 48), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (21, 48), generator=g, dtype=torch.int8)
    sa = torch.rand(33, 1, generator=g) * 1e-2 + 1e-3
    sb = torch.rand(21, 1, generator=g) * 1e-2 + 1e-3
    bias = (torch.randn(21, generator=g) * 3).to(dtype).to(torch.float32)
    acc = (a.long() @ b.long().T).to(torch.float32)
    f32 = (acc * sa) * sb.T
    out = ops.int_gemm_nt(a, b, sa, sb, dtype, "reference", bias=bias)
    assert out.dtype == dtype and torch.equal(out, (f32 + bias).to(dtype))
    assert torch.equal(ops.int_gemm_nt(a, b, sa, sb, dtype, "reference"), f32.to(dtype))
    assert torch.equal(ref.int_gemm_nt(a, b, sa, sb, dtype, bias=None), f32.to(dtype))
    if dtype != torch.float32:  # rounding first, then adding, moves some outputs by an ulp
        assert not torch.equal(out, f32.to(dtype) + bias.to(dtype))


def test_int_gemm_nt_float_operands_add_the_bias_in_their_dtype():
    a, b = _x(5, 16, 3), _x(6, 16, 4)
    sa, sb = torch.full((5, 1), 0.5), torch.ones(1, 1)
    bias = torch.randn(6)
    out = ops.int_gemm_nt(a, b, sa, sb, torch.float64, "reference", bias=bias)
    torch.testing.assert_close(out, (a @ b.T) * 0.5 + bias.double(), atol=TOL, rtol=0)


@pytest.mark.parametrize("bad,why", [
    (torch.ones(4), "shape \\(4,\\)"),                       # N is 3
    (torch.ones(1, 3), "shape \\(1, 3\\)"),                  # 2-D
    (torch.ones(3, 1), "shape \\(3, 1\\)"),
    (torch.ones(3, dtype=torch.bfloat16), "dtype torch.bfloat16"),
    (torch.ones(3, dtype=torch.float64), "dtype torch.float64"),
    (torch.ones(3, device="meta"), "on meta"),                  # another device
])
@pytest.mark.parametrize("backend", ["reference", "fast"])
def test_int_gemm_nt_rejects_a_bad_bias(bad, why, backend):
    import hot.fast  # noqa: F401  (registers its implementations)

    a = torch.ones(4, 16, dtype=torch.int8)
    b = torch.ones(3, 16, dtype=torch.int8)
    with pytest.raises(ValueError, match=f"int_gemm_nt: bias must be a 1-D float32 tensor of "
                       f"N = 3 elements .* on cpu, got .*{why}.*b.to\\(torch.float32\\)"):
        ops.int_gemm_nt(a, b, torch.ones(4, 1), torch.ones(3, 1), torch.float32, backend,
                        bias=bad)


@pytest.mark.parametrize("bits", [0, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_declared_shapes_match_every_implementation(bits, dtype):
    """The fake implementations (what tracing sees) give each registered implementation's output
    shapes and dtypes, for the reference and the fast backend (interpreter on CPU)."""
    import hot.fast  # noqa: F401  (registers its implementations)

    x = torch.randn(20, 33, dtype=dtype)
    hq = HQArgs(bits, ScaleMode.ROW, True, 1)
    hla = HLAArgs(8, "lowpass", bits or 8, ScaleMode.TENSOR, True, 1)
    for backend in ("reference", "fast"):
        for got, want in ((ops.hq_quantize(x, hq, backend), ops.hq_fake(x, hq)),
                          (ops.hla_quantize(x, hla, backend), ops.hla_fake(x, hla))):
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype, (backend, g.shape, w.shape)
    a = torch.randint(-7, 8, (4, 32), dtype=torch.int8)
    b = torch.randint(-7, 8, (3, 32), dtype=torch.int8)
    for dt, bias in ((torch.float32, None), (torch.bfloat16, torch.ones(3))):
        out = ops.int_gemm_nt(a, b, torch.ones(4, 1), torch.ones(1, 1), dt, "reference",
                              bias=bias)
        fake = ops.int_gemm_fake(a, b, dt, bias=bias)
        assert out.shape == fake.shape and out.dtype == fake.dtype


def test_gy_quantize_is_one_operation_on_a_backend_without_a_fused_pass(monkeypatch):
    """ops.gy_quantize composes the two quantizers itself where a backend has no fused pass (the
    reference): callers that watch the public operations (the GPU layer test compares the
    operation sequences of two backends) see one gy_quantize, as on the fast backend."""
    seen = []
    for name in ("hq_quantize", "hla_quantize"):
        orig = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _o=orig, _n=name: seen.append(_n) or _o(*a))
    x = torch.randn(40, 24)
    hq = HQArgs(4, ScaleMode.ROW, False, 0)
    hla = HLAArgs(8, "lowpass", 8, ScaleMode.ROW, False, 0)
    (q1, s1), (q2, s2) = ops.gy_quantize(x, hq, hla, ops.DEFAULT)
    assert seen == []
    assert torch.equal(q1, ref.hq_quantize(x, hq).q) and torch.equal(q2, ref.hla_quantize(x, hla).q)


def test_compose_layer_backward_is_the_definition(monkeypatch):
    """ops.compose_layer_backward runs layer_backward's definition: gy_quantize, hq_quantize of
    W^T, the two int_gemm_nt and g_y's column sums; given a backend's own g_y operands and
    column sums, it uses them (gy_quantize is not called)."""
    g = torch.Generator().manual_seed(7)
    gy, wt = torch.randn(48, 24, generator=g), torch.randn(40, 24, generator=g)
    hq, hq_w = HQArgs(4, ScaleMode.ROW, False, 3), HQArgs(4, ScaleMode.TENSOR, False, 5)
    hla = HLAArgs(8, "lowpass", 8, ScaleMode.ROW, False, 4)
    codes = ops.hla_quantize(torch.randn(48, 40, generator=g), hla, "reference")
    (q1, s1), (q2, s2) = ops.gy_quantize(gy, hq, hla, "reference")
    qw, sw = ops.hq_quantize(wt, hq_w, "reference")
    want = (ops.int_gemm_nt(q1, qw, s1, sw, torch.float32, "reference"),
            ops.int_gemm_nt(q2, codes.q, s2, codes.scale, torch.float16, "reference"))
    args = (gy, wt, codes, hq, hla, hq_w, torch.float32, torch.float16)
    got = ops.compose_layer_backward(*args, True, "reference")
    assert torch.equal(got.gx, want[0]) and torch.equal(got.gw, want[1])
    assert got.gw.dtype == torch.float16 and torch.equal(got.gb, gy.sum(0))
    assert ops.compose_layer_backward(*args, False, "reference").gb is None
    monkeypatch.setattr(ops, "gy_quantize", lambda *a: pytest.fail("gy_quantize called"))
    sums = torch.ones(24)
    own = ops.compose_layer_backward(*args, True, "reference",
                                     (ops.Quantized(q1, s1 * 2), ops.Quantized(q2, s2)), sums)
    assert torch.equal(own.gx, want[0] * 2) and torch.equal(own.gw, want[1]) and own.gb is sums


_SIZES = (0, 1, 2, 17)


@pytest.mark.parametrize("k", _SIZES)
@pytest.mark.parametrize("m,n", [(m, n) for m in _SIZES for n in _SIZES])
def test_int_gemm_nt_is_exact_on_degenerate_shapes(m, n, k):
    """One token, a one-output head, HLA rank 1 on 16 tokens or fewer: M, N or K of 0 or 1.
    torch._int_mm on the CPU returns uninitialised values for K = 1 (N >= 2); the result must
    still be the int64 product, scaled, plus the bias where one is given."""
    g = torch.Generator().manual_seed(100 * m + 10 * n + k)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    sa, sb = torch.rand(m, 1, generator=g) + 0.5, torch.rand(n, 1, generator=g) + 0.5
    bias = torch.randn(n, generator=g) * 50
    exact = (a.to(torch.int64) @ b.to(torch.int64).T).to(torch.float32)
    assert torch.equal(ref._int_product(a, b), exact)
    out = ops.int_gemm_nt(a, b, sa, sb, torch.float32, "reference")
    assert torch.equal(out, exact.mul(sa).mul(sb.T))
    out = ops.int_gemm_nt(a, b, sa, sb, torch.float32, "reference", bias=bias)
    assert torch.equal(out, exact.mul(sa).mul(sb.T).add(bias))


def test_int32_chunks_never_leave_a_one_column_chunk(monkeypatch):
    """K = chunk + 1 would leave a one-column chunk for torch._int_mm: the chunks are cut so
    that none is shorter than two columns."""
    seen = []
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b: seen.append(a.shape[1]) or real(a, b))
    a = torch.randint(-127, 128, (3, 1001), dtype=torch.int8)
    b = torch.randint(-127, 128, (4, 1001), dtype=torch.int8)
    got = ref._int_product_i32(a, b, chunk=1000)
    assert min(seen) >= 2 and sum(seen) == 1001, seen
    assert torch.equal(got, (a.long() @ b.long().T).to(torch.float32))


def test_degenerate_products_run_the_default_on_every_backend(monkeypatch):
    """ops.int_gemm_nt hands an (M, N, K) product with a size of 0 or 1 to the default
    implementation whatever the backend, and layer_backward declines such a layer (its
    operations then go through int_gemm_nt)."""
    calls = []
    monkeypatch.setitem(ops._IMPLS["int_gemm_nt"], "probe", lambda *args, **kw:
                        calls.append((args, kw)) or ref.int_gemm_nt(*args, **kw))
    monkeypatch.setitem(ops._IMPLS["layer_backward"], "probe",
                        lambda *args: pytest.fail("layer_backward on a degenerate GEMM"))
    one = torch.ones(1, 1)
    for m, n, k in ((1, 5, 16), (5, 1, 16), (5, 4, 1), (0, 4, 16)):
        a = torch.ones(m, k, dtype=torch.int8)
        b = torch.ones(n, k, dtype=torch.int8)
        ops.int_gemm_nt(a, b, one, one, torch.float32, "probe")
        # the default gets the bias too
        bias = torch.arange(n, dtype=torch.float32) + 0.5
        out = ops.int_gemm_nt(a, b, one, one, torch.float32, "probe", bias=bias)
        assert torch.equal(out, torch.full((m, n), float(k)) + bias)
    assert calls == []
    bias = torch.tensor([0.25, -1.0, 3.0])
    out = ops.int_gemm_nt(torch.ones(2, 16, dtype=torch.int8), torch.ones(3, 16, dtype=torch.int8),
                          one, one, torch.float32, "probe", bias=bias)
    assert len(calls) == 1 and calls[0][1]["bias"] is bias  # handed on as the keyword bias=
    assert torch.equal(out, torch.full((2, 3), 16.0) + bias)
    hq = HQArgs(4, ScaleMode.ROW, False, 0)
    hla = HLAArgs(1, "lowpass", 8, ScaleMode.ROW, False, 0)
    codes = ops.Quantized(torch.ones(6, 1, dtype=torch.int8), torch.ones(6, 1))
    assert ops.layer_backward(torch.randn(3, 4), torch.randn(6, 4), codes, hq, hla, hq,
                              torch.float32, torch.float32, False, "probe") is None
