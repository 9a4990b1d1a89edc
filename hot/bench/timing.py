"""Timing helpers: CUDA-event medians after warm-up, rotating input sets larger than L2, and the
two ceilings (copy bandwidth, matrix rates) measured in the same process."""

from __future__ import annotations

import torch


def bench(fn, sets=None, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median milliseconds of ``fn(*s)`` cycling through the input sets ``sets`` (so repeated
    calls do not find their inputs in L2), timed with CUDA events by triton.testing.do_bench."""
    from triton.testing import do_bench

    sets = sets or [()]
    i = [0]

    def run():
        s = sets[i[0] % len(sets)]
        i[0] += 1
        fn(*s)

    return float(do_bench(run, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def host_us(fn, n: int = 30) -> float:
    """Median microseconds of host (CPU) time of one ``fn()`` made with an empty GPU queue: the
    launch overhead a call pays before any kernel runs."""
    import time

    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[n // 2] * 1e6


def wall_ms(step, n: int, warmup: int = 3) -> tuple[float, list[float]]:
    """(median, all) wall-clock milliseconds of ``n`` calls of ``step()`` after ``warmup`` untimed
    ones: for CPU runs, where a call's wall time is all of its cost (no device queue)."""
    import statistics
    import time

    for _ in range(warmup):
        step()
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        t.append(1000 * (time.perf_counter() - t0))
    return statistics.median(t), t


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy, counting bytes read plus bytes written."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    return 2 * a.numel() * 2 / (ms * 1e-3)


def matmul_rate(dtype=torch.bfloat16, n: int = 8192) -> float:
    """ops/s of an n^3 matrix product on random data (bf16 through cuBLAS)."""
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    ms = bench(lambda: a @ b)
    return 2 * n**3 / (ms * 1e-3)


def int8_rate(n: int = 8192) -> tuple[float, str]:
    """ops/s of the fast backend's int8 GEMM (the path int_gemm_nt picks) at n^3, int4-range codes."""
    from ..fast import gemm

    a = torch.randint(-7, 8, (n, n), device="cuda", dtype=torch.int8)
    b = torch.randint(-7, 8, (n, n), device="cuda", dtype=torch.int8)
    s = torch.ones(n, 1, device="cuda")
    ms = bench(lambda: gemm.int_gemm_nt(a, b, s, s, torch.bfloat16))
    return 2 * n**3 / (ms * 1e-3), gemm.gemm_path(a, b)


def env_info() -> dict:
    import platform
    import subprocess

    import triton

    p = torch.cuda.get_device_properties(0)
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        drv = "unknown"
    from ..fast import native

    return {"gpu": p.name, "sm": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "driver": drv, "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__, "python": platform.python_version(),
            # whether the fast backend launches a layer backward in one C++ call (hot.fast.native)
            "native": native.why_off() or "on"}
