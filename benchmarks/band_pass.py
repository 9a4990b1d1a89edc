"""An HQ pass with per-row scales alone (the quantized forward's pass over x, and over W): the
two kernels (stats, then quantize: two reads of x) against one read (hot.fast.passes.BandPlan,
onepass_kernel's bands), on a GPU, with the floor of each.

    python benchmarks/band_pass.py

Floor = (one read of x + the int8 codes) / copy bandwidth. Times are medians of CUDA-event
timings (hot.bench.timing.bench), over 4 inputs in turn so that no call finds its input in L2;
both ways give the same codes, bit for bit (tests/fast/test_band_pass.py).
"""
import torch

from hot.bench.timing import bench, copy_bandwidth
from hot.common.ops import HQArgs, ScaleMode, pad_to
from hot.fast import passes
from hot.fast import quantize as fq

# Llama-1b (16 x 2048 tokens: x of q/k/v, o, gate/up, down; the output layer's x is q's shape)
# and ViT-B/16 batch 128 (x of qkv, proj, fc1: 768 wide; fc2: 3072), then Llama-1b's W shapes.
SHAPES = [(32768, 2048), (32768, 8192), (25216, 768), (25216, 3072), (2048, 2048),
          (8192, 2048), (2048, 8192), (32000, 2048)]
FORWARD = HQArgs(8, ScaleMode.ROW, False, 0)  # hot.nn.forward.forward_args("int8")


def main() -> None:
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy {bw / 1e12:.2f} TB/s (read + write)")
    print(f"{'rows x cols':>14} {'two kernels':>12} {'one read':>10} {'speed-up':>9} "
          f"{'floor':>8} {'one read / floor':>17}")
    for r, c in SHAPES:
        xs = [torch.randn(r, c, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        band = passes.plan_for(xs[0], FORWARD, None)
        two = passes.plan_for(xs[0], FORWARD, None, band=False)
        t_two = bench(lambda x: fq.run_pass(x, two, FORWARD, None), [(x,) for x in xs])
        t_one = bench(lambda x: fq.run_pass(x, band, FORWARD, None), [(x,) for x in xs])
        ran = band.band is not None and fq._BAND_FITS.get(band.uid)
        floor = (r * c * 2 + r * pad_to(c)) / bw * 1e3
        print(f"{r:>7} x {c:<5} {t_two:>10.3f}ms {t_one:>8.3f}ms {t_two / t_one:>8.2f}x "
              f"{floor:>6.3f}ms {t_one / floor:>16.2f}x" + ("" if ran else "  (no band: two kernels)"))


if __name__ == "__main__":
    main()
