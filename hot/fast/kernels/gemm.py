"""Triton int8 GEMM "NT" with the dequantizing epilogue of int_gemm_nt fused in.

out[m, n] = cvt(((float32(sum_k a[m, k] b[n, k]) * sa[m]) * sb[n]) + bias[n]) with HAS_BIAS (a
float32 vector of N values), without the addition otherwise: each float32 operation rounded to
nearest in the reference's order and one rounding into the output dtype, so the epilogue is
bit-identical once the sum is exact. The bias is added in the epilogue, before that rounding,
rather than by a pass of its own over the output.

The int32 accumulator overflows once K * max|a| * max|b| reaches 2^31 (K > 131072 for arbitrary
int8 codes). With SPLIT_K_ELEMS > 0 the K loop runs in chunks of that many elements, each chunk
summed in int32 and the chunks in int64: exact for any K below 2^31 / 128^2 * 2^32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program pid in grouped order: GROUP_M row-tiles share their B tiles
    while those are in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def int8_gemm_nt_kernel(
    a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, o_ptr, M, N, K,
    sam, sak, sbn, sbk, ssa, ssb, sbias, som, son,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K_ELEMS: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_base = a_ptr + rm[:, None].to(tl.int64) * sam
    b_base = b_ptr + rn[None, :].to(tl.int64) * sbn
    mmask = rm[:, None] < M
    nmask = rn[None, :] < N
    n_iter = tl.cdiv(K, BLOCK_K)
    if SPLIT_K_ELEMS > 0:
        CHUNK: tl.constexpr = SPLIT_K_ELEMS // BLOCK_K
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int64)
        for c0 in range(0, n_iter, CHUNK):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
            for it in range(c0, tl.minimum(c0 + CHUNK, n_iter)):
                k = it * BLOCK_K + rk
                a = tl.load(a_base + k[None, :] * sak, mask=mmask & (k[None, :] < K), other=0)
                b = tl.load(b_base + k[:, None] * sbk, mask=nmask & (k[:, None] < K), other=0)
                acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            total += acc.to(tl.int64)
        accf = total.to(tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for it in range(0, n_iter):
            k = it * BLOCK_K + rk
            a = tl.load(a_base + k[None, :] * sak, mask=mmask & (k[None, :] < K), other=0)
            b = tl.load(b_base + k[:, None] * sbk, mask=nmask & (k[:, None] < K), other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        accf = acc.to(tl.float32)
    sa = tl.load(sa_ptr + rm * ssa, mask=rm < M, other=1.0)
    sb = tl.load(sb_ptr + rn * ssb, mask=rn < N, other=1.0)
    out = accf * sa[:, None] * sb[None, :]
    if HAS_BIAS:  # once, after the whole K sum (the split-K chunks included)
        bias = tl.load(bias_ptr + rn * sbias, mask=rn < N, other=0.0)
        out = out + bias[None, :]
    tl.store(o_ptr + rm[:, None].to(tl.int64) * som + rn[None, :] * son,
             out.to(o_ptr.dtype.element_ty), mask=mmask & nmask)
