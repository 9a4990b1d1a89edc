"""The last step of the bias gradient from the g_y pass: summing the stats kernel's per-row-of-
tiles float32 partial sums (hot.fast.quant.gy_pass bsum=True) and casting to g_y's dtype, in
the two layouts the stats kernel could store them: (row tiles, C) summed over dim 0 (the old
layout) and (C, row tiles) summed over dim 1 (an inner-axis reduction, the layout in use). GPU
only; ViT-B/16 batch 128 (25216 tokens, 64-row tiles: 394 partial rows) and Llama-8B shapes.

    python benchmarks/bias_partials.py
"""
import torch

from hot.bench.timing import bench


def main() -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for tiles, c in ((394, 768), (394, 2304), (394, 3072), (64, 6144), (64, 28672)):
        rows = [torch.randn(tiles, c, device="cuda") for _ in range(8)]
        cols = [r.t().contiguous() for r in rows]
        old = bench(lambda p: p.sum(0).to(torch.bfloat16), [(p,) for p in rows])
        new = bench(lambda p: p.sum(1).to(torch.bfloat16), [(p,) for p in cols])
        same = torch.equal(rows[0].sum(0).to(torch.bfloat16), cols[0].sum(1).to(torch.bfloat16))
        print(f"partials {tiles} x {c}: sum(0) {old * 1e3:.1f} us, column-major sum(1) "
              f"{new * 1e3:.1f} us (bf16 results equal: {same})")


if __name__ == "__main__":
    main()
