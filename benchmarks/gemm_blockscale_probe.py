"""A probe of a design HOT does not have: per-block HLA scales (one per channel and block of G
coefficient rows) would let the g_y and ABC passes quantize each tile from its own absmax, one
read and no delayed scale, but the g_W GEMM must then apply a scale per K block, promoting its
int32 partial sums to float every G rows. Does such a GEMM run near HOT's per-row-scaled one on
HOT's g_W shapes (O x I x K, K = tokens / 2)?

    python benchmarks/gemm_blockscale_probe.py      (a GPU)

Prints, per shape: the int8 floor, CUTLASS as HOT runs it (gemm.int_gemm_nt), a Triton int8
GEMM with per-row scales (rowscale) and the same with per-K-block scales for G = 256, 512, 1024
(the per-row scales repeated per block, so its result must equal rowscale's up to the float
order), both Triton variants autotuned over the same configs. The kernel lives here, not in
hot/fast/kernels: nothing in HOT uses it.
"""
import sys

import torch
import triton
import triton.language as tl

from hot.bench.timing import bench, int8_rate
from hot.fast import gemm as fg
from hot.fast.kernels.gemm import grouped_tile

CFGS = [triton.Config({"BM": bm, "BN": bn, "BK": 128, "GM": 8}, num_warps=w, num_stages=s)
        for bm, bn, w, s in [(128, 128, 8, 4), (128, 256, 8, 3), (128, 128, 4, 4),
                             (256, 128, 8, 3), (64, 128, 4, 5)]]
# g_W shapes (O, I, K = tokens / 16 * 8): Llama-1b at 32768 tokens; ViT-B's at 24576 tokens
# (K a multiple of every G below; HOT's ViT-B step has 25216)
SHAPES = [(2048, 2048, 16384), (8192, 2048, 16384), (2048, 8192, 16384), (32000, 2048, 16384),
          (768, 768, 12288), (2304, 768, 12288), (3072, 768, 12288), (768, 3072, 12288)]


@triton.autotune(CFGS, key=["M", "N", "K", "G", "BLOCKSCALE"])
@triton.jit
def probe_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, o_ptr, M, N, K, G: tl.constexpr,
                      BLOCKSCALE: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr, GM: tl.constexpr):
    """o = sum over K blocks of G: float(a_blk b_blk^T) * sa[blk, m] * sb[blk, n] (BLOCKSCALE),
    else float(a b^T) * sa[m] * sb[n]; a (M x K), b (N x K) int8, K-contiguous."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BM, BN, GM)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_p = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    b_p = b_ptr + rn[None, :].to(tl.int64) * K + rk[:, None]
    if BLOCKSCALE:
        out = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(0, K // G):
            acc = tl.zeros((BM, BN), dtype=tl.int32)
            for _ in range(0, G // BK):
                acc = tl.dot(tl.load(a_p), tl.load(b_p), acc, out_dtype=tl.int32)
                a_p += BK
                b_p += BK
            sa = tl.load(sa_ptr + kb * M + rm)
            sb = tl.load(sb_ptr + kb * N + rn)
            out += acc.to(tl.float32) * (sa[:, None] * sb[None, :])
    else:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
        for _ in range(0, K // BK):
            acc = tl.dot(tl.load(a_p), tl.load(b_p), acc, out_dtype=tl.int32)
            a_p += BK
            b_p += BK
        out = acc.to(tl.float32) * tl.load(sa_ptr + rm)[:, None] * tl.load(sb_ptr + rn)[None, :]
    tl.store(o_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], out.to(tl.bfloat16))


def probe_gemm(a, b, sa, sb, G, blockscale):
    M, K = a.shape
    N = b.shape[0]
    o = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    probe_gemm_kernel[lambda m: (triton.cdiv(M, m["BM"]) * triton.cdiv(N, m["BN"]),)](
        a, b, sa, sb, o, M, N, K, G, blockscale)
    return o


def main() -> int:
    rate, _ = int8_rate()
    print(f"int8 rate {rate / 1e12:.0f} TOP/s")
    for o_, i_, k_ in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randint(-127, 128, (o_, k_), device="cuda", dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (i_, k_), device="cuda", dtype=torch.int8, generator=g)
        sa = torch.rand(o_, device="cuda") + 0.5
        sb = torch.rand(i_, device="cuda") + 0.5
        cut = bench(lambda: fg.int_gemm_nt(a, b, sa[:, None], sb[:, None], torch.bfloat16))
        row = bench(lambda: probe_gemm(a, b, sa, sb, 256, False))
        line = (f"{o_}x{i_}x{k_}: floor {2 * o_ * i_ * k_ / rate * 1e3:.4f} ms; cutlass {cut:.4f}; "
                f"triton rowscale {row:.4f}")
        ref = probe_gemm(a, b, sa, sb, 256, False).float()
        for G in (256, 512, 1024):
            sab = sa[None, :].expand(k_ // G, o_).contiguous()
            sbb = sb[None, :].expand(k_ // G, i_).contiguous()
            t = bench(lambda: probe_gemm(a, b, sab, sbb, G, True))
            err = ((probe_gemm(a, b, sab, sbb, G, True).float() - ref).abs().max()
                   / ref.abs().max()).item()
            line += f"; blockscale G={G} {t:.4f} (rel err vs rowscale {err:.1e})"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
