"""Break the fused g_y pass down on a GPU: stats kernel alone, quantize kernel alone, both, and the
host time of one call, for each kernel variant (transform matrices built arithmetically or
gathered; persistent grid of P programs per SM or one program per tile).

    python benchmarks/gy_pass_breakdown.py

Floor = (one read of g_y + the HQ codes + the HLA codes) / copy bandwidth, as in hot.bench.backward.
"""
import sys
import time

import torch

from hot.bench.timing import bench, copy_bandwidth
from hot.fast import quant as fq

SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]
VARIANTS = [(1, 8), (1, 4), (1, 16), (1, 0), (0, 8), (0, 0)]  # (ARITH, PROGS_PER_SM)
HQ = (4, "row", True, 1)
HLA = (8, "lowpass", 8, "row", True, 2)


def host_us(fn, n=30):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[n // 2] * 1e6


def _parts(x):
    """(stats only, quantize only) launchers for x with the current variant."""
    r, c = x.shape
    p = fq._pass_plan(r, c, x.dtype, x.device, HQ[:3], HLA[:5])
    nh, nl = p["nh"], p["nl"]
    hq_q = torch.empty((r, p["c16"]), dtype=torch.int8, device=x.device)
    hq_s = torch.empty((nh, 1), dtype=torch.float32, device=x.device)
    hla_q = torch.empty((c, p["lr"]), dtype=torch.int8, device=x.device)
    hla_s = torch.empty((nl, 1), dtype=torch.float32, device=x.device)

    def stats():
        amax, epoch = fq._WS.take(x.device, nh + nl + 1)
        base = (x, x.stride(0), x.stride(1), r, c, p["h16"], p["t"], amax, amax[nh:])
        p["stats"](p["grid"], base + (epoch,), p["sw"])
        return base

    base = stats()

    def quant():
        p["quant"](p["grid"], base + (hq_q, hq_s, p["c16"], fq._key(1), hla_q, hla_s, p["lr"],
                                      p["l16"] // 16, fq._key(2)), p["qsw"])

    return stats, quant


def main():
    best = {}
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    for arith, progs in VARIANTS:
        fq.ARITH, fq.PROGS_PER_SM = bool(arith), progs
        fq._pass_plan.cache_clear()
        for r, c in SHAPES:
            gs = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
            floor = (r * c * 2 + r * c + c * r // 2) / bw * 1e3
            ms = bench(lambda g: fq.gy_quantize(g, *HQ, *HLA), gs)
            st, qu = _parts(gs[0][0])
            ms_st = bench(st)
            ms_qu = bench(qu)
            hu = host_us(lambda: fq.gy_quantize(gs[0][0], *HQ, *HLA))
            best.setdefault((arith, progs), []).append(ms)
            print(f"arith={arith} progs/SM={progs:2d} {r}x{c}: pass {ms:.3f} ms ({100 * floor / ms:.0f}% "
                  f"of copy; floor {floor:.3f}) = stats {ms_st:.3f} + quant {ms_qu:.3f}; host {hu:.0f} us",
                  flush=True)
        w = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16)
        print(f"  w_pass 2304x768: {bench(lambda: fq.hq_quantize(w.t(), 4, 'row', True, 3)):.3f} ms, "
              f"host {host_us(lambda: fq.hq_quantize(w.t(), 4, 'row', True, 3)):.0f} us", flush=True)
    # The variant with the smallest total time over the shapes (for scripts/gpu_run.sh).
    a, p = min(best, key=lambda v: sum(best[v]))
    print(f"BEST HOT_FAST_QARITH={a} HOT_FAST_QPROGS={p}")


if __name__ == "__main__":
    sys.exit(main())
