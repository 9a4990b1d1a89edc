"""Sweep the quantizer tile (BLOCK_R, BLOCK_C, num_warps) for the fused g_y pass on a GPU and
print the median time (autotuned tile, hot.fast.quant._TILES) and % of copy bandwidth (floor bytes: one read of g_y + the codes), the W
pass (hq_quantize of a transposed 768x2304 / 4096x4096 weight), and the host time of one call
(CPU clock around a call made with an empty GPU queue)."""
import sys

import torch

from hot.bench.timing import bench, copy_bandwidth, host_us
from hot.fast import quant as fq

SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]



def main():
    bw = copy_bandwidth()
    for r, c in SHAPES:
        gs = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        floor = (r * c * 2 + r * c + c * r // 2) / bw * 1e3
        ms = bench(lambda g: fq.gy_quantize(g, 4, "row", True, 1, 8, "lowpass", 8, "row", True, 2), gs)
        # The autotuned launchers of the variant in use (as hot.fast.quant._pass_plan asks for
        # them: the butterfly HLA methods need no minimum tile height).
        v4 = fq._VARIANTS[fq.QKERNEL_VARIANT]
        st, qu, _ = fq._kernels(16 if v4 and v4[1] != "dot" else 32, None, fq.QKERNEL_VARIANT)
        best = [str(getattr(k.__closure__[0].cell_contents, "best_config", None)) for k in (st, qu)]
        hu = host_us(lambda: fq.gy_quantize(gs[0][0], 4, "row", True, 1, 8, "lowpass", 8, "row", True, 2))
        print(f"gy_pass {r}x{c}: {ms:.3f} ms, floor {floor:.3f} ms ({100 * floor / ms:.0f}% of copy), "
              f"host {hu:.0f} us, tiles {best}", flush=True)
    for o, i in ((2304, 768), (4096, 4096)):
        w = [(torch.randn(o, i, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        ms = bench(lambda w: fq.hq_quantize(w.t(), 4, "row", True, 3), w)
        hu = host_us(lambda: fq.hq_quantize(w[0][0].t(), 4, "row", True, 3))
        print(f"w_pass {o}x{i}: {ms:.3f} ms, host {hu:.0f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
