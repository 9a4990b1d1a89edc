"""Break the fused g_y pass down on a GPU: stats kernel alone, quantize kernel alone, both, and the
host time of one call.

Measured on an H200 (2026-11-22, run 3) with two variants that were then dropped: a persistent
1-D grid (P programs per SM looping over tiles) and transform matrices from Sylvester sign
parities instead of gathers. The parities changed nothing measurable; the loop made the pass
slower (ViT qkv 25216x2304: 0.30 ms at 4-16 programs per SM, 0.38-0.40 ms at one tile per
program, against 0.25 ms for the 2-D grid without a loop). The quantize kernel is ~85% of the
pass (0.26 of 0.30 ms) while the stats kernel, which reads the same tile and runs the same two
transforms, is near its read floor (0.047 ms): the cost is in quantize's per-element work.

    python benchmarks/gy_pass_breakdown.py [--ab]

--ab: on the ViT-B qkv g_y (25216 x 2304 bf16) only, what the quantize kernel's parts cost: the
default; round-to-nearest instead of stochastic rounding (no hash); other tiles. (Measured once
and dropped: HQ and HLA quantized by two launches after the shared stats launch, run 7, quantize
0.196 ms, whole pass 0.267 vs 0.252 ms fused. Run 6 timed a multiply by the reciprocal scale
against the exact division, 0.153 vs 0.181 ms; the reciprocal is the spec since issue 4's
epilogue change, so that row is gone.)

Floor = (one read of g_y + the HQ codes + the HLA codes) / copy bandwidth, as in hot.bench.backward.
"""
import sys

import torch

from hot.bench.timing import bench, copy_bandwidth, host_us
from hot.fast import quant as fq

SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]
HQ = (4, "row", True, 1)
HLA = (8, "lowpass", 8, "row", True, 2)



def _parts(x, hq=HQ, hla=HLA):
    """(stats only, quantize only) launchers for x (arguments as hot.fast.quant.gy_pass builds
    them, outputs allocated once)."""
    p = fq.plan_for(x, hq, hla)
    stats_args, quant_args, _ = fq.pass_args(x, p, hq, hla)

    def stats():
        p["stats"](p["grid"], stats_args, p["sw"])

    stats()

    def quant():
        p["quant"](p["grid"], quant_args, p["qsw"])

    return stats, quant


def ab():
    x = torch.randn(25216, 2304, device="cuda", dtype=torch.bfloat16)
    nearest = ((4, "row", False, 1), (8, "lowpass", 8, "row", False, 2))
    for name, tile, args in (("default", None, (HQ, HLA)),
                             ("round to nearest", None, nearest),
                             ("tile 32x64x4", (32, 64, 4), (HQ, HLA)),
                             ("tile 64x128x4", (64, 128, 4), (HQ, HLA)),
                             ("tile 128x64x8", (128, 64, 8), (HQ, HLA)),
                             ("tile 64x64x8", (64, 64, 8), (HQ, HLA))):
        fq._FIXED = tile
        fq._kernels.cache_clear()
        fq._pass_plan.cache_clear()
        st, qu = _parts(x, *args)
        print(f"ab {name:26s}: stats {bench(st):.3f} ms, quant {bench(qu):.3f} ms", flush=True)
    fq._FIXED = None
    fq._kernels.cache_clear()
    fq._pass_plan.cache_clear()


def main():
    if "--ab" in sys.argv:
        return ab()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    for idx64, (r, c) in [(i, sh) for i in (False, True) for sh in SHAPES]:
        # int32 offsets (the default below 2^31 elements) against forced int64 offsets.
        fq.FORCE_IDX64 = idx64
        fq._pass_plan.cache_clear()
        gs = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        floor = (r * c * 2 + r * c + c * r // 2) / bw * 1e3
        ms = bench(lambda g: fq.gy_quantize(g, *HQ, *HLA), gs)
        st, qu = _parts(gs[0][0])
        ms_st = bench(st)
        ms_qu = bench(qu)
        hu = host_us(lambda: fq.gy_quantize(gs[0][0], *HQ, *HLA))
        print(f"{'int64' if idx64 else 'int32'} offsets {r}x{c}: pass {ms:.3f} ms ({100 * floor / ms:.0f}% "
              f"of copy; floor {floor:.3f}) = stats {ms_st:.3f} + quant {ms_qu:.3f}; host {hu:.0f} us",
              flush=True)
    fq.FORCE_IDX64 = False
    fq._pass_plan.cache_clear()
    w = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16)
    print(f"  w_pass 2304x768: {bench(lambda: fq.hq_quantize(w.t(), 4, 'row', True, 3)):.3f} ms, "
          f"host {host_us(lambda: fq.hq_quantize(w.t(), 4, 'row', True, 3)):.0f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
