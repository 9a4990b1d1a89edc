"""Sweep the quantizer tile (BLOCK_R, BLOCK_C, num_warps) for the fused g_y pass on a GPU and
print the median time and % of copy bandwidth (floor bytes: one read of g_y + the codes), the W
pass (hq_quantize of a transposed 768x2304 / 4096x4096 weight), and the host time of one call
(CPU clock around a call made with an empty GPU queue)."""
import sys
import time

import torch

from hot.bench.timing import bench, copy_bandwidth
from hot.fast import quant as fq

SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]
TILES = [(64, 64, 4), (64, 128, 4), (128, 64, 4), (128, 128, 8), (32, 128, 4), (64, 256, 8)]


def host_us(fn, n=20):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[n // 2] * 1e6


def main():
    bw = copy_bandwidth()
    for r, c in SHAPES:
        gs = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        floor = (r * c * 2 + r * c + c * r // 2) / bw * 1e3
        row = []
        for br, bc, w in TILES:
            fq.BLOCK_R, fq.BLOCK_C, fq.NUM_WARPS = br, bc, w
            ms = bench(lambda g: fq.gy_quantize(g, 4, "row", True, 1, 8, "lowpass", 8, "row", True, 2), gs)
            row.append(f"{br}x{bc}/{w}: {ms:.3f} ms ({100 * floor / ms:.0f}%)")
        print(f"gy_pass {r}x{c} floor {floor:.3f} ms | " + " | ".join(row), flush=True)
    fq.BLOCK_R, fq.BLOCK_C, fq.NUM_WARPS = 64, 64, 4
    g = torch.randn(25216, 768, device="cuda", dtype=torch.bfloat16)
    print(f"host gy_pass call {host_us(lambda: fq.gy_quantize(g, 4, 'row', True, 1, 8, 'lowpass', 8, 'row', True, 2)):.0f} us")
    for o, i in ((2304, 768), (4096, 4096)):
        w = [(torch.randn(o, i, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        ms = bench(lambda w: fq.hq_quantize(w.t(), 4, "row", True, 3), w)
        hu = host_us(lambda: fq.hq_quantize(w[0][0].t(), 4, "row", True, 3))
        print(f"w_pass {o}x{i}: {ms:.3f} ms, host {hu:.0f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
