"""Triton kernels for the two transforms + quantizers (HQ and HLA) over one 2-D tensor.

One kernel body per phase serves hq_quantize, hla_quantize and the fused g_y pass; each program
loads one (BLOCK_R x BLOCK_C) tile of x and applies whichever transforms are switched on. Absmax
scales need a global reduction, so a call is two launches over the same tiles:

    stats_kernel: transform, fold the tile's absmax of each scale group into an int64 vector
        with atomic_max on (EPOCH << 32) | bit pattern of |t| (non-negative floats order like
        their bit patterns, and a NaN's pattern 0x7FC00000 exceeds +Inf's, so NaN wins: it
        propagates). EPOCH grows by one per call, so this call's first atomic_max on an entry
        replaces whatever an earlier call left there: the vector is a reused workspace that
        needs no zeroing (every entry a call reads is written by at least one of its tiles);
    quant_kernel: transform again, scale = amax / qmax (1 where amax == 0, NaN/Inf propagate,
        written out by the first program of each row/column), r = 1 / scale once per row/column,
        v = t * r, round (hash-stream stochastic or half-even), store int8 codes.

The quantize kernels must be compiled with enable_fp_fusion=False (hot.fast.quant passes it):
the spec rounds t * r and then v + u separately, and with fusion on, Triton / ptxas contract
them into one FMA (and v - floor(v) of the nearest rounding into fma(t, r, -floor)), which moves
a code wherever the unrounded product lies on the other side of a boundary
(tests/common/test_quant.py builds such a case). The butterflies' other products are by 1/4 or
by 2^-16, exact either way; the dots' products with the +-1/4 matrices are exact too.

Hash stream (hot.common.quant): one lowbias32 hash per PAIR of codes (indices 2m, 2m + 1), its
low 16 bits for the even code and its high 16 bits for the odd one. Where both codes of a pair
sit in one program (HQ: adjacent columns of a row, C16 a multiple of 16; HLA: adjacent
coefficients t of one block, rank >= 2) the kernels hash once per pair; ``_u_at`` computes any
single code's u from the formula.

Transforms are plain tile GEMMs against constant block-diagonal matrices (no reshapes), gathered
in registers from the 16x16 H16 and the RP x 16 T (tiny, L1-resident):
    HQ : t = x_tile (BR, BC) @ HB,   HB = blockdiag(H16, ..., H16) (BC x BC), H16 = sylvester/4
    HLA: z = TB @ x_tile,            TB = blockdiag(T, ..., T) (BR/16*RP x BR),
         T (RP x 16) = T_r padded with zero rows to RP = next power of two >= rank,
         so row j*RP + t of z is coefficient t of the tile's local block j.
H16 and T_r entries are +-1/4 (exact in bf16), so a bf16 input can use bf16 tensor cores with
fp32 accumulation; fp32 inputs use an fp32 ('ieee') dot.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .arch import INTERPRET

# Stochastic codes on the GPU: floor(v + u) by cvt.rmi.s32.f32 (libdevice float2int_rd), which
# floors and converts in one instruction, maps NaN to 0 and saturates, then an integer clamp:
# the same codes as floor, float clamp, NaN select and convert (4 instructions per code fewer,
# about 10% of the quantize kernel's; docs/kernels.md). The interpreter has no libdevice and
# runs the float form.
_FLOOR_CVT = tl.constexpr(not INTERPRET)


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
def _u_lo(w):
    """(k + 1/2) / 2^16 for k = the low 16 bits of the uint32 hash w. Built as the float32 bit
    pattern of 1 + k 2^-16 + 2^-17 (k in mantissa bits 22..7, bit 6 the half) minus 1.0, which
    is exact (17 significant bits), instead of an int-to-float conversion (quarter rate on
    NVIDIA GPUs)."""
    b = ((w << 7) & 0x7FFF80) | 0x3F800040
    return b.to(tl.float32, bitcast=True) - 1.0


@triton.jit
def _u_hi(w):
    """(k + 1/2) / 2^16 for k = the high 16 bits of w (as _u_lo)."""
    b = ((w >> 9) & 0x7FFF80) | 0x3F800040
    return b.to(tl.float32, bitcast=True) - 1.0


@triton.jit
def _u_at(idx, key):
    """u of the code at row-major index ``idx`` (int32 or int64, >= 0) from the formula: the
    half (idx & 1) of mix32(((idx >> 1) mod 2^32) ^ key). One hash per code: for codes whose
    pair partner is not at hand."""
    w = _mix32((idx >> 1).to(tl.uint32) ^ key)
    odd = (idx & 1) == 1
    return tl.where(odd, _u_hi(w), _u_lo(w))


@triton.jit
def _u_pairs_last(pair0, key, N: tl.constexpr):
    """u of N codes at consecutive indices along a new last axis (N even), one hash per pair:
    ``pair0`` holds (index of the first code) >> 1 as uint32, the first index even."""
    us = ()
    for p in tl.static_range(N // 2):
        w = _mix32((pair0 + p) ^ key)
        us = us + (_u_lo(w), _u_hi(w))
    return us


@triton.jit
def _recip(s):
    """r = 1 / s correctly rounded, 0 where that overflows to +Inf (s < 2^-128), as
    quant.reciprocal; r of an Inf scale is 0 and of a NaN scale NaN (codes 0 either way)."""
    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    return tl.where(r > 3.4028234663852886e38, 0.0, r)


@triton.jit
def _round(v, u, QMAX: tl.constexpr, STOCH: tl.constexpr):
    """clamp(floor(v + u), +-QMAX) (v + u one float32 addition) with u from the hash stream, or
    clamp(round_half_even(v)) (u unused); NaN -> 0 (the scale carries the NaN), exactly as
    quant.round_to_levels."""
    if STOCH and _FLOOR_CVT:
        qi = libdevice.float2int_rd(v + u)
        lim = tl.full((1,), QMAX, tl.float32).to(tl.int32)
        qi = tl.minimum(tl.maximum(qi, -lim), lim)
    else:
        if STOCH:
            q = tl.floor(v + u)
        else:
            f = tl.floor(v)
            d = v - f  # exact for |v| < 2^23; the codes are far smaller
            odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
            q = tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)
        ok = q == q
        q = tl.minimum(tl.maximum(q, -QMAX), QMAX)
        qi = tl.where(ok, q, 0.0)
    return qi.to(tl.int8)


@triton.jit
def _abs_bits(t):
    # |t| as its int32 bit pattern: clearing the sign bit also turns -NaN into a positive NaN.
    return t.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _tagged(a, epoch):
    # (epoch << 32) | a for the epoch-tagged atomic max; a >= 0 (int32 bit pattern of |t|).
    return (epoch.to(tl.int64) << 32) | a.to(tl.int64)


@triton.jit
def _scale(amax_tagged, QMAX: tl.constexpr):
    a = (amax_tagged & 0x7FFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    return tl.where(a == 0.0, 1.0, tl.math.div_rn(a, tl.full(a.shape, QMAX, tl.float32)))


@triton.jit
def _group_recip(amax_ptr, s_ptr, idx, mask, pid_r, pid_c, PER_GROUP: tl.constexpr,
                 ALONG_ROWS: tl.constexpr, QMAX: tl.constexpr):
    """1 / scale of the tile's scale groups (_recip of _scale of the tagged absmax), writing the
    scales out once: per group (groups ``idx`` along the tile's rows if ALONG_ROWS, else its
    columns) by the tiles of the first tile column (resp. row), per tensor (a scalar) by tile
    (0, 0). One return statement (see _idx)."""
    if PER_GROUP:
        s = _scale(tl.load(amax_ptr + idx, mask=mask, other=0), QMAX)
        if ALONG_ROWS:
            writes = pid_c == 0
        else:
            writes = pid_r == 0
        if writes:
            tl.store(s_ptr + idx, s, mask=mask)
    else:
        s = _scale(tl.load(amax_ptr), QMAX)
        if (pid_r == 0) & (pid_c == 0):
            tl.store(s_ptr, s)
    return _recip(s)


@triton.jit
def _idx(v, IDX64: tl.constexpr):
    # Offsets in int64 only where a tensor can pass 2^31 elements: int32 index math is cheaper.
    # One return statement: triton 3.6 rejects differently typed returns even under a constexpr if.
    if IDX64:
        v = v.to(tl.int64)
    return v


@triton.jit
def _load_tile(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
               DOT_DTYPE: tl.constexpr, IDX64: tl.constexpr):
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    x = tl.load(x_ptr + _idx(rows[:, None], IDX64) * sxr + _idx(cols[None, :], IDX64) * sxc,
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0)
    return x.to(DOT_DTYPE), rows, cols


@triton.jit
def _hq_t(x, h_ptr, BLOCK_C: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr):
    # HB[i, j] = H16[i % 16, j % 16] on the diagonal 16x16 blocks, else 0 (gathered from the
    # 16x16 matrix in L1, so one compiled kernel serves every tile size).
    i = tl.arange(0, BLOCK_C)
    same = (i[:, None] // 16) == (i[None, :] // 16)
    hb = tl.load(h_ptr + (i[:, None] % 16) * 16 + (i[None, :] % 16), mask=same, other=0.0)
    return tl.dot(x, hb.to(DOT_DTYPE), input_precision=PREC, out_dtype=tl.float32)


@triton.jit
def _hla_z(x, t_ptr, BLOCK_R: tl.constexpr, ZR: tl.constexpr, RP: tl.constexpr,
           DOT_DTYPE: tl.constexpr, PREC: tl.constexpr):
    # TB[k, i] = T[k % RP, i % 16] where row block k // RP meets column block i // 16, else 0;
    # T (RP x 16) is T_r with zero rows past the rank.
    k = tl.arange(0, ZR)
    i = tl.arange(0, BLOCK_R)
    same = (k[:, None] // RP) == (i[None, :] // 16)
    tb = tl.load(t_ptr + (k[:, None] % RP) * 16 + (i[None, :] % 16), mask=same, other=0.0)
    return tl.dot(tb.to(DOT_DTYPE), x, input_precision=PREC, out_dtype=tl.float32)


@triton.jit(do_not_specialize=["epoch"])
def stats_kernel(
    x_ptr, sxr, sxc, R, C, hb_ptr, tb_ptr, hq_amax_ptr, hla_amax_ptr, epoch, bsum_ptr,
    RP: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, IDX64: tl.constexpr,
    DO_BSUM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # bsum_ptr / DO_BSUM: the v4 kernel's bias partial sums; this variant never forms them.
    tl.static_assert(not DO_BSUM)
    ZR: tl.constexpr = BLOCK_R // 16 * RP
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    x, rows, cols = _load_tile(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R, BLOCK_C, DOT_DTYPE, IDX64)
    if DO_HQ:
        # Padding columns (C <= col < C16) transform to real values and count; whole blocks past
        # C16 are zero and change no max.
        a = tl.max(_abs_bits(_hq_t(x, hb_ptr, BLOCK_C, DOT_DTYPE, PREC)), axis=1)
        if HQ_ROW:
            tl.atomic_max(hq_amax_ptr + rows, _tagged(a, epoch), mask=rows < R, sem="relaxed")
        else:
            tl.atomic_max(hq_amax_ptr, _tagged(tl.max(a, axis=0), epoch), sem="relaxed")
    if DO_HLA:
        # Rows of z for t >= rank come from zero rows of TB and blocks past L16 from zero input.
        a = tl.max(_abs_bits(_hla_z(x, tb_ptr, BLOCK_R, ZR, RP, DOT_DTYPE, PREC)), axis=0)
        if HLA_ROW:
            tl.atomic_max(hla_amax_ptr + cols, _tagged(a, epoch), mask=cols < C, sem="relaxed")
        else:
            tl.atomic_max(hla_amax_ptr, _tagged(tl.max(a, axis=0), epoch), sem="relaxed")


@triton.jit
def _hq_u_tile(rows, pid_c, C16, key, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
               IDX64: tl.constexpr):
    """u (BLOCK_R, BLOCK_C) of the HQ codes of a tile, code (row, col) at row * C16 + col: the
    pair (col, col + 1) for even col from one hash (C16 and the tile's first column are even)."""
    ce = pid_c * BLOCK_C + 2 * tl.arange(0, BLOCK_C // 2)
    pair0 = ((_idx(rows[:, None], IDX64) * C16 + ce[None, :]) >> 1).to(tl.uint32)
    lo, hi = _u_pairs_last(pair0, key, 2)
    return tl.reshape(tl.join(lo, hi), (BLOCK_R, BLOCK_C))


@triton.jit(do_not_specialize=["hq_key", "hla_key"])
def quant_kernel(
    x_ptr, sxr, sxc, R, C, hb_ptr, tb_ptr, hq_amax_ptr, hla_amax_ptr,
    hq_q_ptr, hq_s_ptr, C16, hq_key,
    hla_q_ptr, hla_s_ptr, LR, NBLK, hla_key,
    RANK: tl.constexpr, RP: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr, HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, IDX64: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Codes and scales of one tile (module docstring); compile with enable_fp_fusion=False."""
    ZR: tl.constexpr = BLOCK_R // 16 * RP
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    x, rows, cols = _load_tile(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R, BLOCK_C, DOT_DTYPE, IDX64)
    rmask = rows < R
    if DO_HQ:
        t = _hq_t(x, hb_ptr, BLOCK_C, DOT_DTYPE, PREC)
        r = _group_recip(hq_amax_ptr, hq_s_ptr, rows, rmask, pid_r, pid_c, HQ_ROW, True, HQ_QMAX)
        if HQ_ROW:
            v = t * r[:, None]
        else:
            v = t * r
        if HQ_STOCH:
            u = _hq_u_tile(rows, pid_c, C16, hq_key.to(tl.uint32, bitcast=True), BLOCK_R,
                           BLOCK_C, IDX64)
        else:
            u = v  # unused by nearest rounding
        off = _idx(rows[:, None], IDX64) * C16 + cols[None, :]
        q = _round(v, u, HQ_QMAX, HQ_STOCH)
        tl.store(hq_q_ptr + off, q, mask=rmask[:, None] & (cols[None, :] < C16))
    if DO_HLA:
        cmask = cols < C
        z = _hla_z(x, tb_ptr, BLOCK_R, ZR, RP, DOT_DTYPE, PREC)  # (ZR, BLOCK_C)
        r = _group_recip(hla_amax_ptr, hla_s_ptr, cols, cmask, pid_r, pid_c, HLA_ROW, False,
                         HLA_QMAX)
        if HLA_ROW:
            v = z * r[None, :]
        else:
            v = z * r
        # Every rank hla_rows accepts is a power of two, so T has no padding rows (RP == RANK)
        # and the tile's codes of one column are ZR consecutive bytes: code (block jb, row tk)
        # sits at jb * RANK + tk == pid_r * ZR + k. Written as such, the compiler sees the
        # contiguity and vectorizes the stores.
        tl.static_assert(RP == RANK)
        k = tl.arange(0, ZR)
        keep = k < (NBLK - pid_r * (BLOCK_R // 16)) * RANK
        off = _idx(cols[None, :], IDX64) * LR + (pid_r * ZR + k)[:, None]
        if HLA_STOCH:
            # Pairs run down axis 0 here; this comparison kernel hashes per code (same values).
            u = _u_at(off, hla_key.to(tl.uint32, bitcast=True))
        else:
            u = v
        q = _round(v, u, HLA_QMAX, HLA_STOCH)
        tl.store(hla_q_ptr + off, q, mask=keep[:, None] & cmask[None, :])
