"""The CUTLASS kernels of csrc/ on a GPU, against exact integer math on the CPU.

Run on an H100/H200 (or an Ampere card) with `pytest -m gpu tests/fast/test_csrc_gpu.py`. The
module fixture uses the prebuilt hot.fast._C, else compiles csrc/ for the visible GPU (about a
minute or two; set TORCH_CUDA_ARCH_LIST to override), so a missing build fails loudly instead of
skipping.

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


@pytest.fixture(scope="module")
def ext():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    mod = _ext.load()
    if mod is None:
        mod = _ext.jit_build(verbose=False)
    return mod


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


def _expected(a, b, sa, sb, dtype, chunk=None):
    """((float32(a @ b^T) * sa) * sb^T) per K chunk, float32 partials summed in chunk order, then
    rounded into dtype; the integer sums are exact (_int_dot) on the CPU."""
    a, b = a.cpu(), b.cpu()
    sa, sb = sa.cpu().float(), sb.cpu().float()
    k = a.shape[1]
    chunk = chunk or k
    out = None
    for k0 in range(0, k, chunk):
        acc = _int_dot(a[:, k0:k0 + chunk], b[:, k0:k0 + chunk])
        part = (acc.to(torch.float32) * sa) * sb.t()
        out = part if out is None else out + part
    return out.to(dtype)


def _run(ext, name, int4, a, b, sa, sb, dtype, max_k=0):
    dev = torch.device("cuda")
    if int4:
        a_d, b_d = ext.pack_int4(a.to(dev), True), ext.pack_int4(b.to(dev), True)
    else:
        a_d, b_d = a.to(dev), b.to(dev)
    name_dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    out = getattr(ext, name)(a_d, b_d, sa.to(dev), sb.to(dev), name_dtype, max_k)
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


@pytest.mark.parametrize("bad", [8, -9, 127])
def test_pack_rejects_codes_outside_int4(ext, bad):
    codes = torch.zeros(4, 32, dtype=torch.int8, device="cuda")
    codes[2, 5] = bad
    # Through the Python wrapper, which checks the range itself: the binding's own check
    # (device flag + .item() + TORCH_CHECK) segfaulted the interpreter on the H200.
    with pytest.raises(RuntimeError, match=r"outside the int4 range \[-8, 7\]"):
        _ext.pack_int4(codes, True)


_ERRORS_CHILD = r"""
import pytest, torch
from hot.fast import _ext
ext = _ext.load() or _ext.jit_build(verbose=False)
fn = getattr(ext, NAME)
dev = "cuda"
a = torch.zeros(16, 24, dtype=torch.int8, device=dev)
with pytest.raises(RuntimeError, match=r"K = 24 \(a\) is not a multiple of 16; pad"):
    fn(a, a, torch.ones(16, 1, device=dev), torch.ones(16, 1, device=dev), "float32", 0)
a = torch.zeros(16, 32, dtype=torch.int8, device=dev)
b = torch.zeros(8, 48, dtype=torch.int8, device=dev)
with pytest.raises(RuntimeError, match="K dimensions differ"):
    fn(a, b, torch.ones(16, 1, device=dev), torch.ones(8, 1, device=dev), "float32", 0)
with pytest.raises(RuntimeError, match=r"sb must have shape \(16, 1\) or \(1, 1\)"):
    fn(a, a, torch.ones(16, 1, device=dev), torch.ones(8, 1, device=dev), "float32", 0)
with pytest.raises(RuntimeError, match="must be int8"):
    fn(a.float(), a, torch.ones(16, 1, device=dev), torch.ones(16, 1, device=dev), "float32", 0)
with pytest.raises(RuntimeError, match="out_dtype must be"):
    fn(a, a, torch.ones(16, 1, device=dev), torch.ones(16, 1, device=dev), "float64", 0)
print("ALL ERRORS RAISED")
"""


def test_input_errors_name_the_fix(ext):
    # In a child process: on the H200 machine (torch 2.11, JIT build) any error raised by the
    # binding crashed the interpreter with SIGSEGV (docs/kernels.md), which would also kill
    # every later test of this file. A crash fails this test, with the signal in the message.
    import subprocess
    import sys

    code = _ERRORS_CHILD.replace("NAME", repr(_kernels(ext)[0][0]))
    r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "ALL ERRORS RAISED" in r.stdout, (
        f"binding error path: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


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


def test_wrappers_match_the_module(ext):
    # hot.fast._ext's wrappers take torch dtypes and reach the same kernels.
    if _ext.load() is None:
        pytest.skip("the wrappers use the prebuilt or HOT_JIT_BUILD module; this run JIT-built its own")
    gen = torch.Generator().manual_seed(5)
    a, b = _codes(33, 64, -7, 7, gen), _codes(40, 64, -7, 7, gen)
    sa, sb = _scales(33, 40, gen)
    exp = _expected(a, b, sa, sb, torch.bfloat16)
    out = _ext.gemm_s8s8_sm80(a.cuda(), b.cuda(), sa.cuda(), sb.cuda(), torch.bfloat16)
    assert torch.equal(out.cpu(), exp)
    out4 = _ext.gemm_s4s4_sm80(_ext.pack_int4(a.cuda()), _ext.pack_int4(b.cuda()), sa.cuda(), sb.cuda(),
                               torch.bfloat16)
    assert torch.equal(out4.cpu(), exp)
