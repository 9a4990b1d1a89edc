"""Sweep the quantizer tile (BLOCK_R, BLOCK_C, num_warps) for the fused g_y pass on a GPU and
print the median time and % of copy bandwidth (floor bytes: one read of g_y + the codes)."""
import sys

import torch

from hot.bench.timing import bench, copy_bandwidth
from hot.fast import quant as fq

SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]
TILES = [(64, 64, 4), (32, 128, 4), (64, 128, 8), (128, 64, 8), (16, 256, 4), (32, 64, 4)]


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


if __name__ == "__main__":
    sys.exit(main())
