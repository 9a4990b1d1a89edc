"""HOT's g_W GEMMs on Hopper: CUTLASS's heuristic decomposition against forced stream-K.

g_W = (O x L/2 HLA codes) . (I x L/2 ABC codes)^T has few output tiles at ViT sizes (O x I =
768 x 768 is 18 tiles of 128 x 256, 3072 x 768 is 72 on a 132-SM H100) and a long K, so how the
K loop is shared between CTAs decides its time. csrc/gemm_sm90_s8.cu takes the stream-K
scheduler below one wave of tiles and forces a stream-K decomposition there (the default since
this benchmark's first run); HOT_SM90_DECOMP=heuristic leaves the choice to CUTLASS's heuristic.
Both must give the same bits (int32 partial sums add exactly).

    python benchmarks/gemm_decomp.py

Prints one markdown table: shape, tiles, heuristic ms, stream-K ms, floor ms, equal.
"""
import os
import sys

import torch

from hot.bench.timing import bench, int8_rate
from hot.fast import _ext

# (name, O, I, K = L / 16 * rank) for ViT-B/16 at batch 128 (L = 25216) and Llama-8B (L = 4096).
SHAPES = [("vitb_qkv", 2304, 768, 12608), ("vitb_proj", 768, 768, 12608),
          ("vitb_fc1", 3072, 768, 12608), ("vitb_fc2", 768, 3072, 12608),
          ("llama8b_o", 4096, 4096, 2048), ("llama8b_down", 4096, 14336, 2048)]


def main() -> int:
    if _ext.load() is None:
        print(f"extension unavailable: {_ext.why_unavailable()}")
        return 1
    ops, _ = int8_rate()
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| g_W GEMM | O x I x K | tiles | heuristic ms | stream-K ms | floor ms | equal |")
    print("|---|---|---:|---:|---:|---:|---|")
    for name, o, i, k in SHAPES:
        sets = []
        for _ in range(3):
            a = torch.randint(-127, 128, (o, k), device="cuda", generator=g, dtype=torch.int8)
            b = torch.randint(-127, 128, (i, k), device="cuda", generator=g, dtype=torch.int8)
            sa = torch.rand(o, 1, device="cuda", generator=g) + 0.5
            sb = torch.rand(i, 1, device="cuda", generator=g) + 0.5
            sets.append((a, b, sa, sb))
        res, outs = {}, {}
        for mode in ("heuristic", "streamk"):
            os.environ["HOT_SM90_DECOMP"] = mode
            fn = lambda a, b, sa, sb: _ext.gemm_s8s8_sm90(a, b, sa, sb, torch.bfloat16)  # noqa: E731
            outs[mode] = fn(*sets[0])
            res[mode] = bench(fn, sets)
        os.environ.pop("HOT_SM90_DECOMP", None)
        tiles = -(-o // 128) * -(-i // 256)
        floor = 2 * o * i * k / ops * 1e3
        eq = torch.equal(outs["heuristic"], outs["streamk"])
        print(f"| {name} | {o}x{i}x{k} | {tiles} | {res['heuristic']:.4f} | {res['streamk']:.4f} | "
              f"{floor:.4f} | {eq} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
