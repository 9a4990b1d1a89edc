"""The CUTLASS kernels of csrc/ on a GPU, against exact integer math on the CPU.

Run on an H100/H200 (or an Ampere card) with `pytest -m gpu tests/fast/test_csrc_gpu.py`. The
module fixture `ext` (tests/fast/conftest.py) loads hot.fast._C through hot.fast._ext (the
prebuilt module, else one compiled now for the visible GPU: about a minute or two; set
TORCH_CUDA_ARCH_LIST to override), so a missing build fails loudly instead of skipping. The kernels are called through the _ext wrappers, which
turn the raw module's (result, err) returns into results or exceptions.

Why bitwise equality is the right bound: the integer sum is exact (int32, no overflow by
construction), and the epilogue does float32(acc) * sa * sb with two float32 multiplications
rounded to nearest and one rounding into the output type, in the same order as the expected
value below. IEEE-754 fixes each of those results, so GPU and CPU must agree to the bit; there
is no addition for an FMA to contract. The chunked path sums float32 partials in chunk order,
which the expected value repeats.
"""

from __future__ import annotations

import pytest
import torch

from hot.fast import _ext

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (M, N): single rows, sizes far below one tile, around and above the 128x256 tiles, N not a
# multiple of 16 (padded internally).
SHAPES = [(1, 16), (37, 53), (130, 300), (257, 129), (512, 256)]


def _cap():
    return torch.cuda.get_device_capability()


def _kernels(ext):
    """The GEMMs this GPU can run: (name, int4?)."""
    major, minor = _cap()
    out = []
    if (major, minor) == (9, 0) and ext.info()["sm90a"]:
        out.append(("gemm_s8s8_sm90", False))
    if major >= 8:
        out += [("gemm_s8s8_sm80", False), ("gemm_s4s4_sm80", True)]
    return out


def _codes(rows, k, lo, hi, gen):
    return torch.randint(lo, hi + 1, (rows, k), generator=gen, dtype=torch.int8)


def _int_dot(a, b):
    """a @ b^T exactly, as int64: float64 products and sums of integer codes are exact while
    |sum| < 2^53 (here at most 140,000 * 128^2 < 2^32), and float64 matmul is far faster on the
    CPU than int64 matmul."""
    return (a.double() @ b.double().t()).long()


def _expected(a, b, sa, sb, dtype, chunk=None, bias=None):
    """((float32(a @ b^T) * sa) * sb^T) per K chunk, float32 partials summed in chunk order, plus
    the float32 bias when given, then rounded into dtype; the integer sums are exact (_int_dot)
    on the CPU."""
    a, b = a.cpu(), b.cpu()
    sa, sb = sa.cpu().float(), sb.cpu().float()
    k = a.shape[1]
    chunk = chunk or k
    out = None
    for k0 in range(0, k, chunk):
        acc = _int_dot(a[:, k0:k0 + chunk], b[:, k0:k0 + chunk])
        part = (acc.to(torch.float32) * sa) * sb.t()
        out = part if out is None else out + part
    if bias is not None:
        out = out + bias.cpu()
    return out.to(dtype)


def _run(ext, name, int4, a, b, sa, sb, dtype, max_k=0):
    dev = torch.device("cuda")
    if int4:
        a_d, b_d = ext.pack_int4(a.to(dev), True), ext.pack_int4(b.to(dev), True)
    else:
        a_d, b_d = a.to(dev), b.to(dev)
    out = getattr(ext, name)(a_d, b_d, sa.to(dev), sb.to(dev), dtype, max_k)
    torch.cuda.synchronize()
    return out


def _scales(m, n, gen, per_tensor_a=False, per_tensor_b=False):
    sa = torch.rand((1 if per_tensor_a else m, 1), generator=gen) * 1.5 + 0.25
    sb = torch.rand((1 if per_tensor_b else n, 1), generator=gen) * 1.5 + 0.25
    return sa.float(), sb.float()


@pytest.mark.parametrize("m,n", SHAPES)
def test_exact_on_awkward_shapes(ext, m, n):
    gen = torch.Generator().manual_seed(m * 1000 + n)
    for name, int4 in _kernels(ext):
        lo, hi = (-8, 7) if int4 else (-128, 127)
        for k in ((32,) if int4 else (16,)) + (4096,):
            a, b = _codes(m, k, lo, hi, gen), _codes(n, k, lo, hi, gen)
            sa, sb = _scales(m, n, gen)
            exp32 = (_int_dot(a, b).to(torch.float32) * sa) * sb.t()
            for dtype in DTYPES:
                out = _run(ext, name, int4, a, b, sa, sb, dtype)
                assert out.dtype == dtype and out.shape == (m, n) and out.is_contiguous()
                exp = exp32.to(dtype)
                assert torch.equal(out.cpu(), exp), f"{name} M={m} N={n} K={k} {dtype}: max |diff| " \
                    f"{(out.cpu().double() - exp.double()).abs().max().item()}"


@pytest.mark.parametrize("m,n,k", [
    (768, 768, 12608),    # ViT-B proj's g_W: 18 tiles of 128x256, stream-K
    (2304, 768, 12608),   # ViT-B qkv's g_W: 54 tiles, split-K in 2 parts on a 132-SM H100
    (3072, 768, 12608),   # ViT-B fc1's g_W: 72 tiles, stream-K
    (2048, 2048, 4096),   # 128 tiles: data-parallel, one wave
])
def test_few_tile_weight_gradient_shapes_are_exact(ext, m, n, k):
    # Outputs of fewer 128x256 tiles than SMs with a long K (HOT's g_W GEMMs): gemm_s8s8_sm90
    # splits the K loop across CTAs (stream-K or split-K, by the tiles per SM) and adds the
    # int32 partials, in arrival order, before the epilogue; the result must still be the exact
    # product, scaled, and the same bits on every call.
    if not any(name == "gemm_s8s8_sm90" for name, _ in _kernels(ext)):
        pytest.skip("needs sm_90a")
    gen = torch.Generator().manual_seed(m + n + k)
    a, b = _codes(m, k, -127, 127, gen), _codes(n, k, -127, 127, gen)
    a[0], b[0] = 127, 127  # the largest partial sums
    sa, sb = _scales(m, n, gen)
    for dtype in DTYPES:
        out = _run(ext, "gemm_s8s8_sm90", False, a, b, sa, sb, dtype)
        assert torch.equal(out.cpu(), _expected(a, b, sa, sb, dtype)), dtype
        again = _run(ext, "gemm_s8s8_sm90", False, a, b, sa, sb, dtype)
        assert torch.equal(again, out), dtype


# (M, N, K): the shapes that pick each gemm_s8s8_sm90 kernel variant (ViT-B's forward GEMMs:
# proj / fc2 class, qkv, a square 2048 one; a small M with a long K, stream-K without a bias),
# and an N that is not a multiple of 16 (the binding pads it).
BIAS_SHAPES = [(4096, 768, 768), (4096, 2304, 768), (4096, 2048, 2048), (256, 768, 4096),
               (37, 53, 64)]


def _bias_operands(m, n, k, int4, dtype, gen):
    lo, hi = (-8, 7) if int4 else (-128, 127)
    a, b = _codes(m, k, lo, hi, gen), _codes(n, k, lo, hi, gen)
    sa, sb = _scales(m, n, gen)
    sa, sb = sa * 1e-3, sb * 1e-3  # |out| far below float16's range
    # a layer's bias as the forward passes it: rounded to the output dtype, then float32
    bias = (torch.randn(n, generator=gen) * 4).to(dtype).to(torch.float32)
    return a, b, sa, sb, bias


def _run_bias(ext, name, int4, a, b, sa, sb, dtype, bias, max_k=0):
    dev = torch.device("cuda")
    if int4:
        a_d, b_d = ext.pack_int4(a.to(dev), True), ext.pack_int4(b.to(dev), True)
    else:
        a_d, b_d = a.to(dev), b.to(dev)
    out = getattr(ext, name)(a_d, b_d, sa.to(dev), sb.to(dev), dtype, max_k, bias=bias.to(dev))
    torch.cuda.synchronize()
    return out.cpu()


@pytest.mark.parametrize("m,n,k", BIAS_SHAPES)
def test_bias_equals_the_reference_bit_for_bit(ext, m, n, k):
    """Every GEMM with a bias against hot.reference.ops.int_gemm_nt with that bias (the
    contract of hot.common.ops.int_gemm_nt: the float32 bias added after the two scale
    multiplications, before the one rounding into the output dtype), bit for bit."""
    from hot.reference import ops as ref

    for name, int4 in _kernels(ext):
        for dtype in DTYPES:
            gen = torch.Generator().manual_seed(m + 3 * n + 7 * k)
            a, b, sa, sb, bias = _bias_operands(m, n, k, int4, dtype, gen)
            out = _run_bias(ext, name, int4, a, b, sa, sb, dtype, bias)
            exp = ref.int_gemm_nt(a, b, sa, sb, dtype, bias=bias)
            assert out.dtype == dtype and out.shape == (m, n)
            assert torch.equal(out, exp), f"{name} M={m} N={n} K={k} {dtype}: max |diff| " \
                f"{(out.double() - exp.double()).abs().max().item()}"


@pytest.mark.parametrize("m,n,k", [(256, 768, 1024), (37, 53, 1024)])
def test_bias_with_k_in_chunks(ext, m, n, k):
    """max_k = 256 splits K = 1024 into four chunks: the float32 partials are summed in chunk
    order, the bias added once to that sum, then one rounding (hot/fast/_ext.py's contract),
    bit for bit; a bias added to each chunk would be counted four times."""
    for name, int4 in _kernels(ext):
        for dtype in DTYPES:
            gen = torch.Generator().manual_seed(m + n + k)
            a, b, sa, sb, bias = _bias_operands(m, n, k, int4, dtype, gen)
            out = _run_bias(ext, name, int4, a, b, sa, sb, dtype, bias, max_k=256)
            assert torch.equal(out, _expected(a, b, sa, sb, dtype, chunk=256, bias=bias)), \
                f"{name} M={m} N={n} {dtype}"


def test_scales_in_place_and_copied(ext):
    # The binding reads a scale in place when its storage extends to a multiple of 256 floats
    # and it starts 16-byte aligned (what hot.fast.passes allocates); a view one float into a
    # buffer (misaligned) or a short storage must be copied, with the same result.
    gen = torch.Generator().manual_seed(13)
    m, n, k = 40, 48, 64
    a, b = _codes(m, k, -127, 127, gen), _codes(n, k, -127, 127, gen)
    sa, sb = _scales(m, n, gen)
    exp = _expected(a, b, sa, sb, torch.float32)
    dev = torch.device("cuda")
    padded = torch.empty(256, device=dev).as_strided((m, 1), (1, 1))
    padded.copy_(sa.to(dev))
    shifted = torch.empty(257, device=dev)[1:].as_strided((m, 1), (1, 1))
    shifted.copy_(sa.to(dev))
    for name, int4 in _kernels(ext):
        if int4:
            continue
        for sa_dev in (padded, shifted, sa.to(dev)):
            out = getattr(ext, name)(a.to(dev), b.to(dev), sa_dev, sb.to(dev), torch.float32, 0)
            assert torch.equal(out.cpu(), exp), name


@pytest.mark.parametrize("per_a,per_b", [(True, False), (False, True), (True, True)])
def test_per_tensor_scales_broadcast(ext, per_a, per_b):
    gen = torch.Generator().manual_seed(7)
    m, n, k = 70, 90, 64
    for name, int4 in _kernels(ext):
        lo, hi = (-8, 7) if int4 else (-127, 127)
        a, b = _codes(m, k, lo, hi, gen), _codes(n, k, lo, hi, gen)
        sa, sb = _scales(m, n, gen, per_a, per_b)
        out = _run(ext, name, int4, a, b, sa, sb, torch.float32)
        assert torch.equal(out.cpu(), _expected(a, b, sa, sb, torch.float32)), name


def test_k_chunks_are_summed_in_order(ext):
    # max_k = 64 splits K = 320 into five chunks on both the int8 and the int4 path.
    gen = torch.Generator().manual_seed(11)
    m, n, k = 45, 70, 320
    for name, int4 in _kernels(ext):
        lo, hi = (-8, 7) if int4 else (-128, 127)
        a, b = _codes(m, k, lo, hi, gen), _codes(n, k, lo, hi, gen)
        sa, sb = _scales(m, n, gen)
        for dtype in DTYPES:
            out = _run(ext, name, int4, a, b, sa, sb, dtype, max_k=64)
            assert torch.equal(out.cpu(), _expected(a, b, sa, sb, dtype, chunk=64)), f"{name} {dtype}"


def test_default_chunk_prevents_int32_overflow(ext):
    # All codes -128: every dot product is K * 16384. K = 140,000 gives 2,293,760,000 > 2^31 - 1,
    # so a single int32 pass would saturate (mma.sync) or wrap; the default chunk (130,816)
    # splits K in two exact partial sums.
    m, n, k = 16, 16, 140_000
    a = torch.full((m, k), -128, dtype=torch.int8)
    b = torch.full((n, k), -128, dtype=torch.int8)
    sa, sb = torch.ones(m, 1), torch.ones(n, 1)
    chunk = ext.info()["max_k_int8"]
    exp = _expected(a, b, sa, sb, torch.float32, chunk=chunk)
    assert exp[0, 0].item() == pytest.approx(k * 16384, rel=1e-6)
    for name, int4 in _kernels(ext):
        if int4:
            continue
        out = _run(ext, name, False, a, b, sa, sb, torch.float32)
        assert torch.equal(out.cpu(), exp), name


def test_int4_pack_round_trip(ext):
    gen = torch.Generator().manual_seed(3)
    codes = _codes(37, 50, -8, 7, gen)
    packed = ext.pack_int4(codes.cuda(), True)
    assert packed.dtype == torch.uint8 and packed.shape == (37, 32)  # K padded to 64 codes
    # The documented layout: low nibble = even element, high nibble = odd element.
    padded = torch.nn.functional.pad(codes, (0, 14)).to(torch.int16)
    want = ((padded[:, 0::2] & 0xF) | ((padded[:, 1::2] & 0xF) << 4)).to(torch.uint8)
    assert torch.equal(packed.cpu(), want)
    assert torch.equal(ext.unpack_int4(packed, 50).cpu(), codes)
    assert torch.equal(ext.unpack_int4(packed, 64).cpu()[:, 50:], torch.zeros(37, 14, dtype=torch.int8))


def _child(code, ext):
    """Runs `code` in a fresh interpreter and fails with its output unless it prints DONE.

    The error tests run in child processes: on the H200 machine (torch 2.11, JIT build) every
    error the binding raised as a C++ exception crashed the interpreter with SIGSEGV
    (docs/kernels.md), which would also kill every later test of this file. The binding now
    returns errors as strings; until a GPU run confirms that, a crash fails only the test that
    hit it, with the signal in the message."""
    import subprocess
    import sys

    prelude = ("import os\nos.environ['HOT_JIT_BUILD'] = '1'\nimport pytest, torch\nfrom hot.fast import _ext\n"
               "assert _ext.load() is not None, _ext.why_unavailable()\n")
    code = prelude + code.replace("NAME", repr(_kernels(ext)[0][0])) + "\nprint('DONE')\n"
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "DONE" in r.stdout, (
        f"binding error path: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


_PACK_RANGE_CHILD = r"""
for bad in (8, -9, 127):
    codes = torch.zeros(4, 32, dtype=torch.int8, device="cuda")
    codes[2, 5] = bad
    # The range flag is set by the pack kernel and read back by the binding (one sync).
    with pytest.raises(ValueError, match=r"pack_int4: codes outside the int4 range \[-8, 7\] \(a 4x32 tensor\)"):
        _ext.pack_int4(codes, True)
    # check=False skips the sync and the check: it packs (the low nibble) without an error.
    assert _ext.pack_int4(codes, False).shape == (4, 16)
"""


def test_pack_rejects_codes_outside_int4(ext):
    _child(_PACK_RANGE_CHILD, ext)


_ERRORS_CHILD = r"""
fn = getattr(_ext, NAME)
raw = getattr(_ext.load(), NAME)
dev = "cuda"
one16, one8 = torch.ones(16, 1, device=dev), torch.ones(8, 1, device=dev)
a = torch.zeros(16, 24, dtype=torch.int8, device=dev)
with pytest.raises(ValueError, match=r"K = 24 \(a\) is not a multiple of 16; pad"):
    fn(a, a, one16, one16, torch.float32)
a = torch.zeros(16, 32, dtype=torch.int8, device=dev)
b = torch.zeros(8, 48, dtype=torch.int8, device=dev)
with pytest.raises(ValueError, match="K dimensions differ"):
    fn(a, b, one16, one8, torch.float32)
with pytest.raises(ValueError, match=r"sb must have shape \(16, 1\) or \(1, 1\), got \[8, 1\]"):
    fn(a, a, one16, one8, torch.float32)
with pytest.raises(ValueError, match="b must be int8, got Float"):
    fn(a, a.float(), one16, one16, torch.float32)
with pytest.raises(ValueError, match="max_k = 8 is below the K alignment 16"):
    fn(a, a, one16, one16, torch.float32, max_k=8)
with pytest.raises(ValueError, match="k = 70 must lie in"):
    _ext.unpack_int4(torch.zeros(4, 16, dtype=torch.uint8, device=dev), 70)
# The raw module returns its error instead of raising, here the out_dtype check the wrapper
# would have caught first.
out, err = raw(a, a, one16, one16, "float64", 0)
assert out is None and err.startswith("ValueError: hot.fast._C: out_dtype must be"), err
out, err = raw(a, a, one16, one16, "float32", 0)
assert err == "" and out.shape == (16, 16) and out.dtype == torch.float32
"""


def test_input_errors_name_the_fix(ext):
    _child(_ERRORS_CHILD, ext)


_OOM_CHILD = r"""
# An exception thrown by torch inside the binding (here the allocation of a 2^20 x 2^20 bf16
# output, 2 TiB) is caught there and comes back as torch.OutOfMemoryError.
big = torch.zeros(1 << 20, 16, dtype=torch.int8, device="cuda")
one = torch.ones(1, 1, device="cuda")
with pytest.raises(torch.OutOfMemoryError, match=r"hot.fast._C.gemm_s8s8_sm\d0: .*out of memory"):
    getattr(_ext, NAME)(big, big, one, one, torch.bfloat16)
"""


def test_torch_exceptions_inside_the_binding_are_caught(ext):
    _child(_OOM_CHILD, ext)


def test_nan_scale_propagates(ext):
    # A NaN scale must reach the output rows it scales, never be swallowed.
    m, n, k = 20, 32, 64
    a = torch.ones(m, k, dtype=torch.int8)
    b = torch.ones(n, k, dtype=torch.int8)
    sa, sb = torch.ones(m, 1), torch.ones(n, 1)
    sa[3] = float("nan")
    for name, int4 in _kernels(ext):
        out = _run(ext, name, int4, a, b, sa, sb, torch.bfloat16).cpu()
        assert torch.isnan(out[3]).all() and not torch.isnan(out[torch.arange(m) != 3]).any(), name


def test_raw_module_returns_result_and_empty_error(ext):
    # The convention the wrappers rely on, on a successful call of the raw module.
    gen = torch.Generator().manual_seed(5)
    a, b = _codes(33, 64, -7, 7, gen), _codes(40, 64, -7, 7, gen)
    sa, sb = _scales(33, 40, gen)
    raw = ext.load()
    ret = raw.gemm_s8s8_sm80(a.cuda(), b.cuda(), sa.cuda(), sb.cuda(), "bfloat16", 0)
    assert isinstance(ret, tuple) and len(ret) == 2 and ret[1] == ""
    assert torch.equal(ret[0].cpu(), _expected(a, b, sa, sb, torch.bfloat16))
    packed, err = raw.pack_int4(a.cuda(), True)
    assert err == "" and torch.equal(packed, ext.pack_int4(a.cuda()))
