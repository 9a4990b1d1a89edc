"""Quantize-kernel variants (issue 4): the same function as quant_kernels, less work per element.

Same runtime arguments, the same scales, codes and hash-stream indices as
``quant_kernels.stats_kernel`` / ``quant_kernel``; only how the two 16-point transforms are
formed differs (so a transformed value may differ by float rounding order, as the dots' already
do). Switches (constexprs), chosen per variant by hot.fast.quant (HOT_FAST_QKERNEL):

HQ_METHOD (t = x_blocks @ H16, H16 = sylvester(16) / 4, Sylvester order):
    "k16"  one K = 16 tensor-core dot: the tile is loaded straight as a (BR*BC/16, 16) operand
           (row m = r * (BC/16) + j holds x[r, 16j : 16j+16]) and multiplied by the 16x16 H16,
           instead of the (BR x BC) @ (BC x BC) block-diagonal product (4x fewer MACs at 64 wide).
    "bfly" 16 loads of (BR, BC/16) slabs (slab i = column 16j + i of every block), the
           natural-order fast Walsh-Hadamard transform as 64 elementwise adds/subs per 16
           values (exact +-1 sums; the 1/4 is an exact power-of-two scaling), then the 16 outputs
           joined (tl.join, register-local) into the (BR, BC) tile for one 16-byte code store
           per block.
    "bflyv" as "bfly", but the tile is loaded once as (BR*BC/16, 16) with vector loads and cut
           into the 16 slabs by tl.reshape / tl.split (register-local where the layout keeps a
           bit of the column index in one thread; the compiler converts the rest).
HLA_METHOD (z[j*R + t, c] = sum_i T_r[t, i] x[16j + i, c]):
    "dot"  the (BR/16*RP x BR) block-diagonal dot of quant_kernels (needs BR/16*RP >= 16).
    "bfly" 16 loads of (BR/16, BC) row slabs (slab i = row 16j + i of every block), the same
           fast transform along the token axis, then only the kept rows: T_r row t is
           sylvester(16) row n_t / 4 (walsh(16) is Sylvester in sequency order), so
           z_t = y[n_t] / 4 with n_t packed in SEL (4 bits per t). The RANK outputs are joined
           into (BR/16, BC, RANK) so a column's codes of one block leave in one vector store.
HLA_PART (1 = split): a third grid axis of size 2 when both halves run: program z = 0 does HQ,
    z = 1 does HLA, so each program holds only one transform's registers (a runtime branch on
    program_id(2)); 0: one program does both (grid z = 1).

Epilogue (hot.common.quant, quant_kernels docstring): v = t * r with r = 1 / scale once per
scale group, codes floor(v + u) or half-even; the hash stream gives one hash per pair of codes.
The butterfly paths hash on the 16 (HQ) or RANK (HLA) output slabs before they are joined: slabs
2p and 2p + 1 hold the even and odd code of one pair, so pair p of a block takes one hash and its
u are joined exactly as the transformed values are (same layout). The K=16 dot path pairs
adjacent columns of its tile (quant_kernels._hq_u_tile); the HLA dot path and rank 1 hash per
code (_u_at). Compiled with enable_fp_fusion=False, like quant_kernel.

Non-finite inputs under "bfly": an Inf stays inside its own block of 16 (no zero entries of a
block-diagonal matrix multiply it), as in the reference; the dot paths turn it into NaN across
the tile row/column (docs/kernels.md). Either way the scale of that row/column is non-finite and
its codes are 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .quant_kernels import (_abs_bits, _group_recip, _hla_z, _hq_u_tile, _idx, _round, _tagged,
                            _u_at, _u_pairs_last)


@triton.jit
def _fwht16(xs):
    """Natural-order (Sylvester) 16-point Walsh-Hadamard transform of a 16-tuple of same-shape
    float32 tensors, unscaled: y_k = sum_i (-1)^popcount(i & k) x_i (4 stages of 16 adds/subs,
    all elementwise: no data moves between threads)."""
    for st in tl.static_range(4):
        ys = ()
        for i in tl.static_range(16):
            if (i >> st) & 1 == 0:
                ys = ys + (xs[i] + xs[i + (1 << st)],)
            else:
                ys = ys + (xs[i - (1 << st)] - xs[i],)
        xs = ys
    return xs


@triton.jit
def _join_last(ts, N: tl.constexpr):
    """(ts[0], ..., ts[N-1]) -> one tensor with a new last axis: out[..., n] = ts[n], N a power
    of two. Each tl.join adds one register-local axis; joining the top index bit first leaves
    bit 0 last, so the axes (..., 2, ..., 2) read back as n in row-major order."""
    for lv in tl.static_range(4):
        if (N >> (lv + 1)) >= 1:
            nx = ()
            for i in tl.static_range(N >> (lv + 1)):
                nx = nx + (tl.join(ts[i], ts[i + (N >> (lv + 1))]),)
            ts = nx
    return ts[0]


@triton.jit
def _split16(x, P: tl.constexpr):
    """x (P, 16) -> 16-tuple of (P,) slabs, slab i = x[:, i]: four halvings of the last axis by
    tl.split (even / odd positions), so slab order is natural after each level's evens + odds."""
    ts = (x,)
    for lv in tl.static_range(4):
        ev = ()
        od = ()
        for s in tl.static_range(1 << lv):
            if lv == 3:
                a, b = tl.split(ts[s])
            else:
                a, b = tl.split(tl.reshape(ts[s], (P, 8 >> lv, 2)))
            ev = ev + (a,)
            od = od + (b,)
        ts = ev + od
    return ts


@triton.jit
def _hq_t_v4(x_ptr, sxr, sxc, R, C, pid_r, pid_c, h_ptr, BLOCK_R: tl.constexpr,
             BLOCK_C: tl.constexpr, HQ_METHOD: tl.constexpr, DOT_DTYPE: tl.constexpr,
             PREC: tl.constexpr, IDX64: tl.constexpr, EVEN: tl.constexpr):
    """t (BLOCK_R, BLOCK_C) float32 = the tile (zero past R / C) times blockdiag(H16), in the
    row-major order of the tile, by HQ_METHOD; plus its rows and cols. EVEN: the tile lies
    inside x (unmasked loads)."""
    NB: tl.constexpr = BLOCK_C // 16
    P: tl.constexpr = BLOCK_R * NB
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    if HQ_METHOD == "bfly":
        jb = pid_c * BLOCK_C + 16 * tl.arange(0, NB)  # first column of each block
        base = x_ptr + _idx(rows[:, None], IDX64) * sxr + _idx(jb[None, :], IDX64) * sxc
        rm = rows[:, None] < R
        xs = ()
        for i in tl.static_range(16):
            if EVEN:
                xi = tl.load(base + i * sxc)
            else:
                xi = tl.load(base + i * sxc, mask=rm & (jb[None, :] + i < C), other=0.0)
            xs = xs + (xi.to(tl.float32),)
        ys = _fwht16(xs)
        t = tl.reshape(_join_last(ys, 16), (BLOCK_R, BLOCK_C)) * 0.25
    else:
        # (P, 16) view of the tile: row m = r * NB + j, column i -> x[r, 16 j + i].
        m = tl.arange(0, P)
        i16 = tl.arange(0, 16)
        r = pid_r * BLOCK_R + m // NB
        c = pid_c * BLOCK_C + (m % NB)[:, None] * 16 + i16[None, :]
        if EVEN:
            xp = tl.load(x_ptr + _idx(r[:, None], IDX64) * sxr + _idx(c, IDX64) * sxc)
        else:
            xp = tl.load(x_ptr + _idx(r[:, None], IDX64) * sxr + _idx(c, IDX64) * sxc,
                         mask=(r[:, None] < R) & (c < C), other=0.0)
        if HQ_METHOD == "k16":
            h = tl.load(h_ptr + i16[:, None] * 16 + i16[None, :])
            t = tl.dot(xp.to(DOT_DTYPE), h.to(DOT_DTYPE), input_precision=PREC,
                       out_dtype=tl.float32)
            t = tl.reshape(t, (BLOCK_R, BLOCK_C))
        else:
            ys = _fwht16(_split16(xp.to(tl.float32), P))
            t = tl.reshape(_join_last(ys, 16), (BLOCK_R, BLOCK_C)) * 0.25
    return t, rows, cols


@triton.jit
def _hq_u_v4(pid_r, pid_c, C16, key, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
             HQ_METHOD: tl.constexpr, IDX64: tl.constexpr):
    """u (BLOCK_R, BLOCK_C) of the hash stream for the HQ codes of the tile (code (row, col) at
    row * C16 + col), joined in the same shape and order as _hq_t_v4 joins t: on the 16 slabs
    of the butterfly paths (slab i = column 16 j + i, so slabs 2p, 2p + 1 are one pair and take
    one hash), on column pairs of the tile for k16. Called after v is formed, so the u are not
    held in registers through the transform (ptxas keeps program order for independent work)."""
    NB: tl.constexpr = BLOCK_C // 16
    P: tl.constexpr = BLOCK_R * NB
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    if HQ_METHOD == "bfly":
        jb = pid_c * BLOCK_C + 16 * tl.arange(0, NB)
        pair0 = ((_idx(rows[:, None], IDX64) * C16 + jb[None, :]) >> 1).to(tl.uint32)
        u = tl.reshape(_join_last(_u_pairs_last(pair0, key, 16), 16), (BLOCK_R, BLOCK_C))
    elif HQ_METHOD == "k16":
        u = _hq_u_tile(rows, pid_c, C16, key, BLOCK_R, BLOCK_C, IDX64)
    else:
        # bflyv's (P,) slabs: m = r * NB + j, block (r, j) starts at code r * C16 + 16 j.
        m = tl.arange(0, P)
        r = pid_r * BLOCK_R + m // NB
        c0 = pid_c * BLOCK_C + (m % NB) * 16
        pair0 = ((_idx(r, IDX64) * C16 + c0) >> 1).to(tl.uint32)
        u = tl.reshape(_join_last(_u_pairs_last(pair0, key, 16), 16), (BLOCK_R, BLOCK_C))
    return u


@triton.jit
def _hla_z_v4(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL: tl.constexpr, RANK: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, IDX64: tl.constexpr,
              EVEN: tl.constexpr):
    """(z, d): z (BLOCK_R/16, BLOCK_C, RANK) float32, z[j, c, t] = sum_i T_r[t, i] x[16 j + i, c]
    over the tile's local blocks j (zero rows past R, zero columns past C), T_r row t being
    sylvester(16) row n_t / 4 with n_t = (SEL >> 4t) & 15; d (BLOCK_R/16, BLOCK_C) the unscaled
    Sylvester row 0, d[j, c] = sum_i x[16 j + i, c] (block sums, for the bias gradient).
    EVEN: the tile lies inside x (unmasked loads)."""
    NJ: tl.constexpr = BLOCK_R // 16
    jr = pid_r * BLOCK_R + 16 * tl.arange(0, NJ)  # first row of each block
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    base = x_ptr + _idx(jr[:, None], IDX64) * sxr + _idx(cols[None, :], IDX64) * sxc
    cm = cols[None, :] < C
    xs = ()
    for i in tl.static_range(16):
        if EVEN:
            xi = tl.load(base + i * sxr)
        else:
            xi = tl.load(base + i * sxr, mask=(jr[:, None] + i < R) & cm, other=0.0)
        xs = xs + (xi.to(tl.float32),)
    ys = _fwht16(xs)
    zs = ()
    for t in tl.static_range(RANK):
        zs = zs + (ys[(SEL >> (4 * t)) & 15] * 0.25,)
    return tl.reshape(_join_last(zs, RANK), (NJ, BLOCK_C, RANK)), ys[0]


@triton.jit(do_not_specialize=["epoch"])
def stats_kernel_v4(
    x_ptr, sxr, sxc, R, C, hb_ptr, tb_ptr, hq_amax_ptr, hla_amax_ptr, epoch, bsum_ptr,
    RP: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, IDX64: tl.constexpr,
    HQ_METHOD: tl.constexpr, HLA_METHOD: tl.constexpr, HLA_PART: tl.constexpr, SEL: tl.constexpr,
    DO_BSUM: tl.constexpr, EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """quant_kernels.stats_kernel with the transforms of HQ_METHOD / HLA_METHOD (module doc):
    the same epoch-tagged atomic max of |t| per scale group. DO_BSUM (HLA "bfly" only): also
    the tile's column sums of x in float32, bsum[c, pid_r] (the bias gradient's partial sums,
    read from the block sums the HLA butterflies form anyway; one store per column, no atomics,
    so the sum over pid_r that follows is deterministic). Column-major (c outermost) so that sum
    is an inner-axis reduction; the programs of consecutive pid_r run together, so their strided
    stores fill each 32-byte sector in L2 before it is written back."""
    tl.static_assert((not DO_BSUM) or (DO_HLA and HLA_METHOD == "bfly"))
    ZR: tl.constexpr = BLOCK_R // 16 * RP
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    part = tl.program_id(2)
    if DO_HQ:
        if part == 0:
            t, rows, cols = _hq_t_v4(x_ptr, sxr, sxc, R, C, pid_r, pid_c, hb_ptr, BLOCK_R,
                                     BLOCK_C, HQ_METHOD, DOT_DTYPE, PREC, IDX64, EVEN)
            a = tl.max(_abs_bits(t), axis=1)
            if HQ_ROW:
                tl.atomic_max(hq_amax_ptr + rows, _tagged(a, epoch), mask=rows < R, sem="relaxed")
            else:
                tl.atomic_max(hq_amax_ptr, _tagged(tl.max(a, axis=0), epoch), sem="relaxed")
    if DO_HLA:
        if part == HLA_PART:
            cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
            if HLA_METHOD == "bfly":
                z, d = _hla_z_v4(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL, RP, BLOCK_R, BLOCK_C,
                                 IDX64, EVEN)
                a = tl.max(tl.max(_abs_bits(z), axis=2), axis=0)
                if DO_BSUM:
                    tl.store(bsum_ptr + _idx(cols, IDX64) * tl.num_programs(0) + pid_r,
                             tl.sum(d, axis=0), mask=cols < C)
            else:
                rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
                x = tl.load(x_ptr + _idx(rows[:, None], IDX64) * sxr + _idx(cols[None, :], IDX64) * sxc,
                            mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0)
                a = tl.max(_abs_bits(_hla_z(x.to(DOT_DTYPE), tb_ptr, BLOCK_R, ZR, RP, DOT_DTYPE,
                                            PREC)), axis=0)
            if HLA_ROW:
                tl.atomic_max(hla_amax_ptr + cols, _tagged(a, epoch), mask=cols < C, sem="relaxed")
            else:
                tl.atomic_max(hla_amax_ptr, _tagged(tl.max(a, axis=0), epoch), sem="relaxed")


@triton.jit
def _hla_u_v4(cols, jb, LR, key, NJ: tl.constexpr, BLOCK_C: tl.constexpr, RANK: tl.constexpr,
              IDX64: tl.constexpr):
    """u (NJ, BLOCK_C, RANK) of the HLA codes at c * LR + jb * RANK + t, joined like _hla_z_v4's
    z: for RANK >= 2 the slabs t = 2p, 2p + 1 are one pair (LR and jb * RANK are even), one hash
    each; for RANK 1 one hash per code."""
    if RANK >= 2:
        pair0 = ((_idx(cols[None, :], IDX64) * LR + (jb * RANK)[:, None]) >> 1).to(tl.uint32)
        u = tl.reshape(_join_last(_u_pairs_last(pair0, key, RANK), RANK), (NJ, BLOCK_C, RANK))
    else:
        u = tl.reshape(_u_at(_idx(cols[None, :], IDX64) * LR + jb[:, None], key), (NJ, BLOCK_C, 1))
    return u


@triton.jit(do_not_specialize=["hq_key", "hla_key"])
def quant_kernel_v4(
    x_ptr, sxr, sxc, R, C, hb_ptr, tb_ptr, hq_amax_ptr, hla_amax_ptr,
    hq_q_ptr, hq_s_ptr, C16, hq_key,
    hla_q_ptr, hla_s_ptr, LR, NBLK, hla_key,
    RANK: tl.constexpr, RP: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr, HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, IDX64: tl.constexpr,
    HQ_METHOD: tl.constexpr, HLA_METHOD: tl.constexpr, HLA_PART: tl.constexpr, SEL: tl.constexpr,
    EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """quant_kernels.quant_kernel with the transforms of HQ_METHOD / HLA_METHOD (module doc):
    scale = amax / qmax (1 where amax == 0), v = t * (1 / scale), codes by _round with u of the
    code's row-major index in q (hash stream, one hash per pair where the pair is at hand), the
    same as quant_kernel. Compile with enable_fp_fusion=False."""
    ZR: tl.constexpr = BLOCK_R // 16 * RP
    tl.static_assert(RP == RANK)  # every rank hla_rows accepts is a power of two
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    part = tl.program_id(2)
    if DO_HQ:
        if part == 0:
            t, rows, cols = _hq_t_v4(x_ptr, sxr, sxc, R, C, pid_r, pid_c, hb_ptr, BLOCK_R,
                                     BLOCK_C, HQ_METHOD, DOT_DTYPE, PREC, IDX64, EVEN)
            rmask = rows < R
            r = _group_recip(hq_amax_ptr, hq_s_ptr, rows, rmask, pid_r, pid_c, HQ_ROW, True,
                             HQ_QMAX)
            if HQ_ROW:
                v = t * r[:, None]
            else:
                v = t * r
            if HQ_STOCH:
                u = _hq_u_v4(pid_r, pid_c, C16, hq_key.to(tl.uint32, bitcast=True), BLOCK_R,
                             BLOCK_C, HQ_METHOD, IDX64)
            else:
                u = v  # unused by nearest rounding
            off = _idx(rows[:, None], IDX64) * C16 + cols[None, :]
            q = _round(v, u, HQ_QMAX, HQ_STOCH)
            if EVEN:
                tl.store(hq_q_ptr + off, q)
            else:
                tl.store(hq_q_ptr + off, q, mask=rmask[:, None] & (cols[None, :] < C16))
    if DO_HLA:
        if part == HLA_PART:
            cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
            cmask = cols < C
            r = _group_recip(hla_amax_ptr, hla_s_ptr, cols, cmask, pid_r, pid_c, HLA_ROW, False,
                             HLA_QMAX)
            key = hla_key.to(tl.uint32, bitcast=True)
            if HLA_METHOD == "bfly":
                # Code (block jb, coefficient t) of column c sits at c * LR + jb * RANK + t.
                z, _ = _hla_z_v4(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL, RANK, BLOCK_R, BLOCK_C,
                                 IDX64, EVEN)
                if HLA_ROW:
                    v = z * r[None, :, None]
                else:
                    v = z * r
                jb = pid_r * (BLOCK_R // 16) + tl.arange(0, BLOCK_R // 16)
                tt = tl.arange(0, RANK)
                off = (_idx(cols[None, :, None], IDX64) * LR + (jb * RANK)[:, None, None]
                       + tt[None, None, :])
                if HLA_STOCH:
                    u = _hla_u_v4(cols, jb, LR, key, BLOCK_R // 16, BLOCK_C, RANK, IDX64)
                else:
                    u = v
                q = _round(v, u, HLA_QMAX, HLA_STOCH)
                if EVEN:
                    tl.store(hla_q_ptr + off, q)
                else:
                    tl.store(hla_q_ptr + off, q,
                             mask=(jb < NBLK)[:, None, None] & cmask[None, :, None])
            else:
                rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
                x = tl.load(x_ptr + _idx(rows[:, None], IDX64) * sxr + _idx(cols[None, :], IDX64) * sxc,
                            mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0)
                z = _hla_z(x.to(DOT_DTYPE), tb_ptr, BLOCK_R, ZR, RP, DOT_DTYPE, PREC)
                if HLA_ROW:
                    v = z * r[None, :]
                else:
                    v = z * r
                k = tl.arange(0, ZR)
                keep = k < (NBLK - pid_r * (BLOCK_R // 16)) * RANK
                off = _idx(cols[None, :], IDX64) * LR + (pid_r * ZR + k)[:, None]
                if HLA_STOCH:
                    u = _u_at(off, key)  # pairs run down axis 0: per code, as quant_kernel
                else:
                    u = v
                q = _round(v, u, HLA_QMAX, HLA_STOCH)
                tl.store(hla_q_ptr + off, q, mask=keep[:, None] & cmask[None, :])
