"""int_gemm_nt on the GPU: dispatch by architecture to CUTLASS (hot.fast._ext, when built) or the
Triton int8 kernel; the result is (a @ b^T) * sa * sb^T (+ bias, added in float32 before the one
rounding into the output dtype) with the integer products summed exactly.

sm_90 (Hopper): int8 wgmma for both GEMMs (Hopper has no int4 tensor cores; int4-valued codes
    travel in int8 containers). CUTLASS SM90 when built, else Triton (which emits wgmma).
sm_80 (Ampere/Ada, or HOT_FAST_ARCH=sm80): CUTLASS SM80 int4 tensor-op for 4-bit-valued operands
    and int8 tensor-op otherwise when built, else Triton (mma.sync int8).
"""

from __future__ import annotations

import functools
import weakref

import torch

from ..common.options import options
from . import _ext
from .arch import arch_for

INT32_SAFE = (1 << 31) - 1
MAX_PROD = 128 * 128  # largest |a * b| for int8 codes


def split_k_elems(k: int, block_k: int = 256) -> int:
    """0 when K * 128^2 fits in int32, else the largest chunk (a multiple of every BLOCK_K we use)
    whose partial sum cannot overflow."""
    if k * MAX_PROD <= INT32_SAFE:
        return 0
    return (INT32_SAFE // MAX_PROD) // block_k * block_k


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the default Triton int8 GEMM (one of _configs();
# the CUTLASS GEMMs replace it where the extension is built).
_FIXED_GEMM = (128, 128, 64, 4, 4)


def _configs():
    import triton

    out = []
    for bm, bn, bk, w, s in ((128, 256, 128, 8, 3), (128, 128, 128, 8, 4), (256, 128, 128, 8, 3),
                             (128, 128, 64, 4, 4), (64, 128, 128, 4, 4)):
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                                 num_warps=w, num_stages=s))
    return out


@functools.lru_cache(maxsize=None)
def _tuned():
    import triton

    from .kernels.gemm import int8_gemm_nt_kernel

    return triton.autotune(_configs(), key=["M", "N", "K", "SPLIT_K_ELEMS"])(int8_gemm_nt_kernel)


def triton_int8_gemm_nt(a, b, sa, sb, out_dtype, split_k: int | None = None, bias=None):
    """The Triton path for int8 a (M, K), b (N, K) and an optional float32 bias (N,) added in
    the epilogue; ``split_k`` overrides the chunk (tests)."""
    from .kernels.gemm import int8_gemm_nt_kernel

    m, k = a.shape
    n = b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    ska = split_k if split_k is not None else split_k_elems(k)
    sa = sa.to(torch.float32)
    sb = sb.to(torch.float32)
    has_bias = bias is not None
    # Without a bias the kernel never reads its pointer: sa stands in for it.
    bias = bias.to(torch.float32) if has_bias else sa
    args = (a, b, sa, sb, bias, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            sa.stride(0) if sa.shape[0] > 1 else 0, sb.stride(0) if sb.shape[0] > 1 else 0,
            bias.stride(0) if has_bias else 0, out.stride(0), out.stride(1))
    # The spec rounds (acc * sa) * sb and the bias addition separately: no FMA contraction.
    launch = dict(HAS_BIAS=has_bias, enable_fp_fusion=False)
    if options().interpret or a.device.type != "cuda":
        bk = 32
        grid = ((m + 15) // 16 * ((n + 15) // 16),)
        int8_gemm_nt_kernel[grid](*args, BLOCK_M=16, BLOCK_N=16, BLOCK_K=bk, GROUP_M=2,
                                  SPLIT_K_ELEMS=ska, **launch)
        return out
    if options().autotune:
        kern = _tuned()
        grid = lambda meta: (((m + meta["BLOCK_M"] - 1) // meta["BLOCK_M"])  # noqa: E731
                             * ((n + meta["BLOCK_N"] - 1) // meta["BLOCK_N"]),)
        kern[grid](*args, SPLIT_K_ELEMS=ska, **launch)
        return out
    # One fixed configuration by default, like the quantizers: autotuning compiles and times 5
    # configurations for every new (M, N, K), which a training run meets at every layer shape
    # and every last batch of an epoch, and its timing buffer (256 MB) lands in the peak memory.
    bm, bn, bk, w, st = _FIXED_GEMM
    grid = ((m + bm - 1) // bm * ((n + bn - 1) // bn),)
    int8_gemm_nt_kernel[grid](*args, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                              SPLIT_K_ELEMS=ska, num_warps=w, num_stages=st, **launch)
    return out


def ext():
    """The extension module (hot.fast._ext.load()), or None when it is not available."""
    return _ext.load()


# Tensors our quantizers wrote with codes in [-7, 7] (bits <= 4), with their version counter at
# that moment: only those go to the packed int4 GEMM, so no device sync is needed to check the
# range, and an in-place change afterwards (version bump) drops the tag.
_SMALL_CODES: dict = {}  # id(tensor) -> (weakref to it, its _version when tagged)


def tag_small_codes(q: torch.Tensor) -> torch.Tensor:
    # Keyed by id with a weakref (a WeakKeyDictionary would compare tensors with ==).
    key = id(q)
    _SMALL_CODES[key] = (weakref.ref(q, lambda _r, k=key: _SMALL_CODES.pop(k, None)), q._version)
    return q


def _small(t: torch.Tensor) -> bool:
    e = _SMALL_CODES.get(id(t))
    return e is not None and e[0]() is t and e[1] == t._version


def cutlass_operand_ok(t: torch.Tensor, k_mult: int = 16) -> bool:
    """Whether the CUTLASS GEMMs take t as it is: K-contiguous, K a multiple of k_mult, 16-byte
    aligned rows and data."""
    return (t.stride(1) == 1 and t.shape[1] % k_mult == 0 and t.stride(0) % 16 == 0
            and t.data_ptr() % 16 == 0)


def int_gemm_nt(a, b, sa, sb, out_dtype, bias=None):
    """int8 codes on a GPU (or the interpreter), with an optional float32 bias (N,) added before
    the one rounding into out_dtype (the op layer has checked it, ops.check_bias, and hands every
    other case to the reference)."""
    if a.device.type != "cuda":
        return triton_int8_gemm_nt(a, b, sa, sb, out_dtype, bias=bias)
    path = gemm_path(a, b)
    sa32 = sa.to(torch.float32).contiguous()
    sb32 = sb.to(torch.float32).contiguous()
    if path == "cutlass_sm90_s8":
        return _ext.gemm_s8s8_sm90(a, b, sa32, sb32, out_dtype, bias=bias)
    if path == "cutlass_sm80_s4":
        return _ext.gemm_s4s4_sm80(_ext.pack_int4(a, False), _ext.pack_int4(b, False), sa32,
                                   sb32, out_dtype, bias=bias)
    if path == "cutlass_sm80_s8":
        return _ext.gemm_s8s8_sm80(a, b, sa32, sb32, out_dtype, bias=bias)
    return triton_int8_gemm_nt(a, b, sa, sb, out_dtype, bias=bias)


def gemm_path(a, b) -> str:
    """Which kernel int_gemm_nt runs for these operands (benchmarks report it).

    CUTLASS only where its one-pass int32 sum is exact (K <= max_k; longer K goes to the Triton
    kernel, whose int64 chunk sums keep the result identical to the reference).
    """
    if not (cutlass_operand_ok(a) and cutlass_operand_ok(b)):
        return "triton_s8"
    k = a.shape[1]
    s4, s8 = ext_caps(a.device, arch_for(a.device))
    if s4 and _small(a) and _small(b) and k <= s4:
        return "cutlass_sm80_s4"
    if s8 and k <= s8:
        return "cutlass_sm90_s8" if arch_for(a.device) == "sm90" else "cutlass_sm80_s8"
    return "triton_s8"


@functools.lru_cache(maxsize=None)
def ext_caps(device: torch.device, arch: str) -> tuple[int, int]:
    """(max K of the int4 GEMM or 0, max K of the int8 GEMM or 0) usable on this device and arch;
    cached, since asking the extension costs host time on every backward."""
    if ext() is None or _ext.why_unavailable(arch, device) is not None:
        return 0, 0
    return (_ext.max_k("int4") if arch == "sm80" else 0), _ext.max_k("int8")
