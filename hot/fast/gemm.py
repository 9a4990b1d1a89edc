"""int_gemm_nt on the GPU: dispatch by architecture to CUTLASS (hot.fast._ext, when built) or the
Triton int8 kernel; the result is (a @ b^T) * sa * sb^T with the integer products summed exactly.

sm_90 (Hopper): int8 wgmma for both GEMMs (Hopper has no int4 tensor cores; int4-valued codes
    travel in int8 containers). CUTLASS SM90 when built, else Triton (which emits wgmma).
sm_80 (Ampere/Ada, or HOT_FAST_ARCH=sm80): CUTLASS SM80 int4 tensor-op for 4-bit-valued operands
    and int8 tensor-op otherwise when built, else Triton (mma.sync int8).
"""

from __future__ import annotations

import functools
import os

import torch

from ..reference import ops as ref
from .arch import arch_for

INT32_SAFE = (1 << 31) - 1
MAX_PROD = 128 * 128  # largest |a * b| for int8 codes


def split_k_elems(k: int, block_k: int = 256) -> int:
    """0 when K * 128^2 fits in int32, else the largest chunk (a multiple of every BLOCK_K we use)
    whose partial sum cannot overflow."""
    if k * MAX_PROD <= INT32_SAFE:
        return 0
    return (INT32_SAFE // MAX_PROD) // block_k * block_k


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

    from .gemm_kernels import int8_gemm_nt_kernel

    return triton.autotune(_configs(), key=["M", "N", "K", "SPLIT_K_ELEMS"])(int8_gemm_nt_kernel)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_int8_gemm_nt(a, b, sa, sb, out_dtype, split_k: int | None = None):
    """The Triton path for int8 a (M, K), b (N, K); ``split_k`` overrides the chunk (tests)."""
    from .gemm_kernels import int8_gemm_nt_kernel

    m, k = a.shape
    n = b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    ska = split_k if split_k is not None else split_k_elems(k)
    sa = sa.to(torch.float32)
    sb = sb.to(torch.float32)
    args = (a, b, sa, sb, out, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            sa.stride(0) if sa.shape[0] > 1 else 0, sb.stride(0) if sb.shape[0] > 1 else 0,
            out.stride(0), out.stride(1))
    if _interpreting() or a.device.type != "cuda":
        bk = 32
        grid = ((m + 15) // 16 * ((n + 15) // 16),)
        int8_gemm_nt_kernel[grid](*args, BLOCK_M=16, BLOCK_N=16, BLOCK_K=bk, GROUP_M=2,
                                  SPLIT_K_ELEMS=ska)
        return out
    kern = _tuned()
    grid = lambda meta: (((m + meta["BLOCK_M"] - 1) // meta["BLOCK_M"])  # noqa: E731
                         * ((n + meta["BLOCK_N"] - 1) // meta["BLOCK_N"]),)
    kern[grid](*args, SPLIT_K_ELEMS=ska)
    return out


def _ext():
    try:
        from . import _ext
    except Exception:
        return None
    return _ext if getattr(_ext, "available", lambda: False)() else None


def int_gemm_nt(a, b, sa, sb, out_dtype):
    if a.dtype != torch.int8 or b.dtype != torch.int8 or a.numel() == 0 or b.numel() == 0:
        return ref.int_gemm_nt(a, b, sa, sb, out_dtype)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"int_gemm_nt: K differs: a {tuple(a.shape)} vs b {tuple(b.shape)}")
    if out_dtype == torch.float64:
        return ref.int_gemm_nt(a, b, sa, sb, out_dtype)
    ext = _ext() if a.device.type == "cuda" else None
    if ext is not None:
        y = ext_gemm(ext, arch_for(a.device), a, b, sa, sb, out_dtype)
        if y is not None:
            return y
    return triton_int8_gemm_nt(a, b, sa, sb, out_dtype)


def ext_gemm(ext, arch, a, b, sa, sb, out_dtype):
    """The CUTLASS GEMM for this arch, or None where it does not take these inputs."""
    return None  # wired up once hot/fast/_ext.py documents its functions
