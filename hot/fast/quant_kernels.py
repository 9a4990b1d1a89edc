"""Triton kernels for the two transforms + quantizers (HQ and HLA) over one 2-D tensor.

One kernel body serves hq_quantize, hla_quantize and the fused g_y pass: each program loads one
(BLOCK_R x BLOCK_C) tile of x once and applies whichever transforms are switched on.
Absmax scales need a global reduction, so every call is two launches over the same tiles:

    PHASE 0: transform, write the per-tile partial absmax (NaN-propagating) of each scale group;
    (host) reduce the partials with torch.amax and form scale = amax / qmax (1 where amax == 0);
    PHASE 1: transform again, divide by the scale, round (hash-stream stochastic or half-even),
             write int8 codes.

Transforms as tensor-core dots on 16-wide groups (the tile is reshaped so every group of 16
consecutive elements is one row of a (n, 16) matrix):
    HQ : tile (r, c)   -> (r * c/16, 16) @ H16          (H16 = sylvester(16) / 4, symmetric)
    HLA: tile^T (c, r) -> (c * r/16, 16) @ T16          (T16[i, t] = T_r[t, i] for t < rank, else 0)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mix32(x):
    # lowbias32 on uint32 (multiplication wraps mod 2^32): the same function as quant.mix32.
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    x = x ^ (x >> 16)
    return x


@triton.jit
def _round(v, idx, key, QMAX: tl.constexpr, STOCH: tl.constexpr):
    """clamp(floor(v + u), +-QMAX) with u from the hash stream at uint32 index ``idx``, or
    clamp(round_half_even(v)); NaN -> 0 (the scale carries the NaN), exactly as quant.round_to_levels."""
    if STOCH:
        bits = _mix32(idx ^ key)
        u = (bits >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24, exact
        q = tl.floor(v + u)
    else:
        f = tl.floor(v)
        d = v - f  # exact for |v| < 2^23; the codes are far smaller
        odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
        q = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
    ok = q == q
    q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
    return tl.where(ok, q, 0.0).to(tl.int8)


@triton.jit
def _nan_absmax(a, keep, axis: tl.constexpr):
    # tl.max lowers to a NaN-ignoring max on GPUs: track NaN separately so it reaches the scale.
    a = tl.where(keep, a, 0.0)
    isn = a != a
    m = tl.max(tl.where(isn, 0.0, a), axis=axis)
    hasn = tl.max(isn.to(tl.int32), axis=axis)
    return tl.where(hasn > 0, float("nan"), m)


@triton.jit(do_not_specialize=["hq_key", "hla_key"])
def hot_tile_kernel(
    x_ptr, sxr, sxc, R, C,
    h_ptr, t_ptr,
    hq_q_ptr, hq_s_ptr, hq_amax_ptr, C16, hq_s_stride, hq_key,
    hla_q_ptr, hla_s_ptr, hla_amax_ptr, LR, NBLK, hla_s_stride, hla_key,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, PHASE: tl.constexpr,
    HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr,
    HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr, RANK: tl.constexpr,
    PREC: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    rmask = rows < R
    cmask = cols < C
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * sxr + cols[None, :].to(tl.int64) * sxc,
                mask=rmask[:, None] & cmask[None, :], other=0.0).to(tl.float32)
    i16 = tl.arange(0, 16)
    if DO_HQ:
        h = tl.load(h_ptr + i16[:, None] * 16 + i16[None, :])
        t = tl.dot(tl.reshape(x, (BLOCK_R * BLOCK_C // 16, 16)), h, input_precision=PREC)
        t = tl.reshape(t, (BLOCK_R, BLOCK_C))
        if PHASE == 0:
            m = _nan_absmax(tl.abs(t), cols[None, :] < C16, 1)
            tl.store(hq_amax_ptr + pid_c * R + rows, m, mask=rmask)
        else:
            s = tl.load(hq_s_ptr + rows * hq_s_stride, mask=rmask, other=1.0)
            v = tl.math.div_rn(t, s[:, None])
            # Row-major index of the code in q, modulo 2^32 (the hash stream's counter).
            idx = (rows[:, None].to(tl.int64) * C16 + cols[None, :]).to(tl.uint32)
            q = _round(v, idx, hq_key.to(tl.uint32, bitcast=True), HQ_QMAX, HQ_STOCH)
            tl.store(hq_q_ptr + rows[:, None].to(tl.int64) * C16 + cols[None, :], q,
                     mask=rmask[:, None] & (cols[None, :] < C16))
    if DO_HLA:
        tm = tl.load(t_ptr + i16[:, None] * 16 + i16[None, :])
        z = tl.dot(tl.reshape(tl.trans(x), (BLOCK_C * BLOCK_R // 16, 16)), tm, input_precision=PREC)
        z = tl.reshape(z, (BLOCK_C, BLOCK_R))  # z[c, 16 j + t] = coefficient t of local block j
        k = tl.arange(0, BLOCK_R)
        jb = pid_r * (BLOCK_R // 16) + k // 16
        tk = k % 16
        keep = (tk < RANK) & (jb < NBLK)
        if PHASE == 0:
            m = _nan_absmax(tl.abs(z), keep[None, :], 1)
            tl.store(hla_amax_ptr + pid_r * C + cols, m, mask=cmask)
        else:
            s = tl.load(hla_s_ptr + cols * hla_s_stride, mask=cmask, other=1.0)
            v = tl.math.div_rn(z, s[:, None])
            pos = jb * RANK + tk
            idx = (cols[:, None].to(tl.int64) * LR + pos[None, :]).to(tl.uint32)
            q = _round(v, idx, hla_key.to(tl.uint32, bitcast=True), HLA_QMAX, HLA_STOCH)
            tl.store(hla_q_ptr + cols[:, None].to(tl.int64) * LR + pos[None, :], q,
                     mask=cmask[:, None] & keep[None, :])
