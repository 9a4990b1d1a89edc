"""Triton kernels of the quantizer pass: HQ and HLA transforms, absmax scales, rounding.

One pass over a 2-D tensor x serves hq_quantize, hla_quantize and the fused g_y pass (both from
the same tiles). Absmax scales need a global reduction, so a pass is two launches over the same
grid of (BLOCK_R x BLOCK_C) tiles:

    stats_kernel: transform each tile and fold its absmax of each scale group into a zeroed
        int32 vector with atomic_max on the bit pattern of |t| (non-negative floats order like
        their bit patterns, and a NaN's pattern 0x7FC00000 exceeds +Inf's, so NaN wins: it
        propagates). The vector is allocated per pass (its memset is one small kernel), so a
        CUDA graph that replays the pass starts from zeros too. With DO_BSUM it also stores the
        tile's column sums of x (the bias gradient's partials).
    quantize_kernel: transform again, scale = amax / qmax (1 where amax == 0, NaN/Inf propagate;
        written out by the first program of each row/column), r = 1 / scale once per group,
        v = t * r, round (hash-stream stochastic or half-even), store int8 codes.

An HQ pass with per-row scales and no HLA part over rows laid out contiguously (a layer's W in
a quantized forward) needs no global reduction: rows_kernel gives each program whole rows, so
it is one launch with no workspace.

With a delayed HLA scale (HLAConfig(amax="delayed"), HLAArgs.history) a pass reads its input
once instead: onepass_kernel quantizes HLA with the previous pass's candidate scales while it
folds this pass's absmax, and the g_y pass's per-row HQ scales come from the band of programs
that share a row of tiles (they meet at a counter); fixup_kernel then writes the HLA scales and
re-reads only the tiles that hold a column whose candidate was not kept (docs/algorithm.md §3).

The math is hot.common.quant's; the quantize kernel must be compiled with enable_fp_fusion=False
(hot.fast.quantize passes it): the spec rounds t * r and then v + u separately, and with fusion
on, ptxas contracts them into one FMA, which moves a code wherever the unrounded product lies on
the other side of a boundary (tests/common/test_quant.py builds such a case).

Transforms (H16 = sylvester(16) / 4; T_r row t = sylvester(16) row n_t / 4, since walsh(16) is
Sylvester in sequency order; n_t packed 4 bits each in the constexpr SEL):
    HQ, stats kernel: one K = 16 tensor-core dot: the tile loaded as a (BR*BC/16, 16) operand (row
        m = r * (BC/16) + j holds x[r, 16j : 16j+16]) times H16. bf16/fp16 inputs times the
        +-1/4 entries are exact products summed in fp32; fp32 inputs use an fp32 ('ieee') dot.
    HQ, quantize kernel: the tile loaded as two (BR*BC/16, 8) halves (row m = r * (BC/16) + j
        holds columns 16j..16j+7, resp. 16j+8..16j+15, of tile row r), so one thread holds a
        whole block and cutting it into 16 slabs (slab i = column 16j + i of every block) by
        tl.split moves no data; then the fast Walsh-Hadamard butterfly (64 adds/subs per 16
        values, exact +-1 sums; the 1/4 is an exact scaling), scale, hash and rounding on the
        slabs (the row's scale and reciprocal are formed once per block a thread holds, not
        once per element), and the codes joined for one 16-byte store per block. (Splitting
        one (BR*BC/16, 16) load instead crosses threads at the last halving: 31 layout
        conversions through shared memory and twice the instructions, benchmarks/
        sass_count.py.) The dot and the butterfly differ by float summation order only, so the
        stats kernel's amax may differ from the quantize kernel's transform by an ulp: a code
        then moves only where its v lies within an ulp of a rounding boundary, the same bound
        the reference comparison allows (tests).
    HLA, both kernels: 16 loads of (BR/16, BC) row slabs (slab i = row 16j + i of every block),
        the same butterfly along the token axis, then only the kept rows, joined into
        (BR/16, BC, RANK) so a column's codes of one block leave in one vector store. The
        butterfly's row 0 (the block sums) gives the bias partial sums.
    HLA with a drawn selection (DRAW; HLAConfig(selection="stratified")): the quantize kernel
        multiplies each block's quarters of slabs by the signs of its draw (quant.block_draws:
        one hash per block of 16 rows, keyed by the runtime hla_draw like a seed) before the
        butterfly, which moves each Walsh row inside its sequency band (walsh.draw_signs), then
        keeps the rows SEL times their weights sqrt(1 / p) (WSEL, 2 bits a row: 1, sqrt 2, 2).
        The stats kernel takes the absmax over all 16 weighted rows (band weights BWSEL) without
        the signs: a draw permutes rows inside a band, so that absmax is the same for every draw
        (bit for bit: the signed butterfly's outputs are the unsigned ones permuted and negated).

Hash stream (hot.common.quant): one lowbias32 hash per PAIR of codes (row-major indices 2m,
2m + 1), its low 16 bits for the even code and its high 16 bits for the odd one. The butterfly
slabs 2p and 2p + 1 hold the even and odd code of one pair, so pair p of a block takes one hash,
and its u are joined exactly as the transformed values are. Rank 1 hashes per code.

Non-finite inputs: an Inf stays inside its own block of 16 in the butterflies, as in the
reference; the stats kernel's dot spreads it into NaN across its block row. Either way the
scale of that row/column is non-finite and its codes are 0.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra import libdevice

from ...common import quant
from ...common.options import options

# Codes on the GPU: floor(v + u) by cvt.rmi.s32.f32 (libdevice float2int_rd), or v rounded half
# to even by cvt.rni.s32.f32 (float2int_rn), each of which rounds and converts in one instruction,
# maps NaN to 0 and saturates, then an integer clamp: the same codes as the float form's floor
# (and, for nearest, its fraction and parity tests), float clamp, NaN select and convert, in 4
# (stochastic) or about 10 (nearest) fewer instructions per code (docs/kernels.md). The
# interpreter has no libdevice and runs the float form.
_FLOOR_CVT = tl.constexpr(not options().interpret)
# quant.delayed_scale's window: candidate c = MARGIN h, kept for c / RANGE <= a <= c (powers of
# two, so the products are exact and the kernels decide as the reference does).
_MARGIN = tl.constexpr(quant.DELAYED_MARGIN)
_RANGE = tl.constexpr(quant.DELAYED_RANGE)


# ---------------------------------------------------------------- random stream


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
def _key(seed_or_base, step_ptr, USE_STEP: tl.constexpr):
    """The hash key of a part's stream as uint32: ``seed_or_base`` is quant.seed_key(seed) given
    by the host, or, with USE_STEP, the base of a StepSeed whose step this program reads from
    ``step_ptr``: key = mix32(step_seed(base, step) ^ 0x9E3779B9), step_seed(base, step) =
    mix32(base ^ mix32(step mod 2^32)) & 0x7FFFFFFF (hot.common.quant)."""
    k = seed_or_base.to(tl.uint32, bitcast=True)
    if USE_STEP:
        step = tl.load(step_ptr).to(tl.uint32)
        k = _mix32((_mix32(k ^ _mix32(step)) & 0x7FFFFFFF) ^ 0x9E3779B9)
    return k


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
    """u of the code at row-major index ``idx`` (>= 0): the half (idx & 1) of
    mix32(((idx >> 1) mod 2^32) ^ key). One hash per code, for codes whose partner is not at hand."""
    w = _mix32((idx >> 1).to(tl.uint32) ^ key)
    odd = (idx & 1) == 1
    return tl.where(odd, _u_hi(w), _u_lo(w))


@triton.jit
def _u_pairs_last(pair0, key, N: tl.constexpr):
    """u of N codes at consecutive indices (N even), one hash per pair, as an N-tuple: ``pair0``
    holds (index of the first code) >> 1 as uint32, the first index even."""
    us = ()
    for p in tl.static_range(N // 2):
        w = _mix32((pair0 + p) ^ key)
        us = us + (_u_lo(w), _u_hi(w))
    return us


# ---------------------------------------------------------------- scales and rounding


@triton.jit
def _recip(s):
    """r = 1 / s correctly rounded, 0 where that overflows to +Inf (s < 2^-128), as
    quant.reciprocal; r of an Inf scale is 0 and of a NaN scale NaN (codes 0 either way)."""
    r = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    return tl.where(r > 3.4028234663852886e38, 0.0, r)


@triton.jit
def _round(v, u, QMAX: tl.constexpr, STOCH: tl.constexpr, BOUNDED: tl.constexpr = False):
    """clamp(floor(v + u), +-QMAX) (v + u one float32 addition) with u from the hash stream, or
    clamp(round_half_even(v)) (u unused); NaN -> 0 (the scale carries the NaN), exactly as
    quant.round_to_levels.

    BOUNDED: the caller guarantees |v| < QMAX + 1/2 wherever v is finite (v = t / scale with the
    scale from the absmax of t's own group, up to the few ulp by which the stats kernel's
    transform may differ: |v| <= QMAX (1 + 2^-15)). Rounded to nearest, such a v then lies within
    +-QMAX already, and the GPU form skips the clamp (two instructions a code)."""
    if _FLOOR_CVT:
        if STOCH:
            qi = libdevice.float2int_rd(v + u)
        else:
            qi = libdevice.float2int_rn(v)  # cvt.rni: half to even, NaN -> 0, saturating
        if STOCH or not BOUNDED:
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
def _scale(amax_bits, QMAX: tl.constexpr):
    a = amax_bits.to(tl.float32, bitcast=True)
    return tl.where(a == 0.0, 1.0, tl.math.div_rn(a, tl.full(a.shape, QMAX, tl.float32)))


@triton.jit
def _group_recip(amax_ptr, s_ptr, idx, mask, pid_r, pid_c, PER_GROUP: tl.constexpr,
                 ALONG_ROWS: tl.constexpr, QMAX: tl.constexpr):
    """1 / scale of the tile's scale groups (_recip of _scale of the absmax bits), writing the
    scales out once: per group (groups ``idx`` along the tile's rows if ALONG_ROWS, else its
    columns) by the tiles of the first tile column (resp. row), per tensor (a scalar) by tile
    (0, 0)."""
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
    # One return statement: triton rejects differently typed returns even under a constexpr if.
    if IDX64:
        v = v.to(tl.int64)
    return v


# ---------------------------------------------------------------- transforms


@triton.jit
def _fwht16(xs):
    """Natural-order (Sylvester) 16-point Walsh-Hadamard transform of a 16-tuple of same-shape
    float32 tensors, unscaled: y_k = sum_i (-1)^popcount(i & k) x_i (4 stages of 16 adds/subs,
    all elementwise: no data moves between threads)."""
    return _fwht_stages(xs, 4)


@triton.jit
def _fwht_stages(xs, STAGES: tl.constexpr):
    """The first STAGES butterfly stages of _fwht16: stage st adds (and subtracts) entries i and
    i + 2^st."""
    for st in tl.static_range(STAGES):
        ys = ()
        for i in tl.static_range(16):
            if (i >> st) & 1 == 0:
                ys = ys + (xs[i] + xs[i + (1 << st)],)
            else:
                ys = ys + (xs[i - (1 << st)] - xs[i],)
        xs = ys
    return xs


@triton.jit
def _fwht16_signed(xs, s1, s2):
    """_fwht16 of the inputs with quarters 1, 2, 3 (i in 4..7, 8..11, 12..15) times the signs
    s1, s2, s1 * s2 (+-1, per element), bit for bit up to the sign of a zero. A quarter's sign
    is constant, so the first two stages (within quarters) run on the unsigned inputs, their
    outputs being the signed ones' times the quarter's sign (RN(s a + s b) = s RN(a + b)); the
    last two fold the signs into their additions, fma(s, b, a) = RN(a + s b) since s b is
    exact: 32 fused operations instead of 12 multiplies and 32 additions."""
    xs = _fwht_stages(xs, 2)
    # Stage 2: quarter 0 with s1 * quarter 1; quarter 2 with s1 * quarter 3 (their common s2
    # applied in stage 3).
    ys = ()
    for i in tl.static_range(16):
        if (i >> 2) & 1 == 0:
            ys = ys + (tl.fma(s1, xs[i + 4], xs[i]),)
        else:
            ys = ys + (tl.fma(-s1, xs[i], xs[i - 4]),)
    # Stage 3: the first half with s2 * the second.
    zs = ()
    for i in tl.static_range(16):
        if i < 8:
            zs = zs + (tl.fma(s2, ys[i + 8], ys[i]),)
        else:
            zs = zs + (tl.fma(-s2, ys[i], ys[i - 8]),)
    return zs


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
def _split_last(x, P: tl.constexpr, N: tl.constexpr):
    """x (P, N) -> N-tuple of (P,) slabs, slab i = x[:, i], N in 2..16 a power of two: halvings
    of the last axis by tl.split (even / odd positions), so slab order is natural after each
    level's evens + odds. Free of data movement while one thread holds the whole last axis."""
    ts = (x,)
    for lv in tl.static_range(4):
        if (N >> lv) >= 2:
            ev = ()
            od = ()
            for s in tl.static_range(1 << lv):
                if (N >> lv) == 2:
                    a, b = tl.split(ts[s])
                else:
                    a, b = tl.split(tl.reshape(ts[s], (P, (N >> lv) // 2, 2)))
                ev = ev + (a,)
                od = od + (b,)
            ts = ev + od
    return ts


@triton.jit
def _load_blocks(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R: tl.constexpr,
                 BLOCK_C: tl.constexpr, IDX64: tl.constexpr, EVEN: tl.constexpr):
    """The tile as (BLOCK_R * BLOCK_C / 16, 16): row m = r * (BLOCK_C/16) + j holds the 16
    columns of block j of tile row r (zero past R / C; EVEN: the tile lies inside x, unmasked)."""
    NB: tl.constexpr = BLOCK_C // 16
    P: tl.constexpr = BLOCK_R * NB
    m = tl.arange(0, P)
    i16 = tl.arange(0, 16)
    r = pid_r * BLOCK_R + m // NB
    c = pid_c * BLOCK_C + (m % NB)[:, None] * 16 + i16[None, :]
    ptr = x_ptr + _idx(r[:, None], IDX64) * sxr + _idx(c, IDX64) * sxc
    if EVEN:
        xp = tl.load(ptr)
    else:
        xp = tl.load(ptr, mask=(r[:, None] < R) & (c < C), other=0.0)
    return xp


@triton.jit
def _hq_t_dot(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R: tl.constexpr,
              BLOCK_C: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr,
              IDX64: tl.constexpr, EVEN: tl.constexpr):
    """t (BLOCK_R, BLOCK_C) float32 = the tile times blockdiag(H16) by one K = 16 dot, with
    H16[i, j] = (-1)^popcount(i & j) / 4 formed in registers."""
    xp = _load_blocks(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R, BLOCK_C, IDX64, EVEN)
    i16 = tl.arange(0, 16)
    b = i16[:, None] & i16[None, :]
    parity = (b ^ (b >> 1) ^ (b >> 2) ^ (b >> 3)) & 1
    h = tl.where(parity == 1, -0.25, 0.25)
    t = tl.dot(xp.to(DOT_DTYPE), h.to(DOT_DTYPE), input_precision=PREC, out_dtype=tl.float32)
    return tl.reshape(t, (BLOCK_R, BLOCK_C))


@triton.jit
def _hla_ys(x_ptr, sxr, sxc, R, C, pid_r, pid_c, dkey, DRAW: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, IDX64: tl.constexpr,
            EVEN: tl.constexpr):
    """The unscaled Sylvester coefficients of the tile's local blocks j as 16 slabs
    (BLOCK_R/16, BLOCK_C): ys[n][j, c] = sum_i (-1)^popcount(n & i) x[16 j + i, c] (zero rows
    past R, zero columns past C); with DRAW, of each block's rows times the signs of its draw
    from the key ``dkey`` (module docstring)."""
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
    if DRAW:
        # m = 4 * (w & 3) for w = mix32(block ^ key): signs (-1)^popcount(m & i) are +1 on the
        # first quarter of the block, then (-1)^b2, (-1)^b3, (-1)^(b2 + b3).
        w = _mix32((pid_r * NJ + tl.arange(0, NJ)).to(tl.uint32) ^ dkey)
        s1 = tl.broadcast_to((1.0 - 2.0 * (w & 1).to(tl.float32))[:, None], xs[0].shape)
        s2 = tl.broadcast_to((1.0 - 2.0 * ((w >> 1) & 1).to(tl.float32))[:, None],
                             xs[0].shape)
        return _fwht16_signed(xs, s1, s2)
    return _fwht16(xs)


@triton.jit
def _weighted(y, CODE: tl.constexpr):
    """y times 1/4 (the orthonormal scale) times sqrt of a row's weight: CODE 0, 1, 2 for
    weights 1, 2, 4 (the float32 constants hot.common.walsh's matrices round to)."""
    if CODE == 1:
        y = y * 0.3535533905932738
    elif CODE == 2:
        y = y * 0.5
    else:
        y = y * 0.25
    return y


@triton.jit
def _hla_pick(ys, SEL: tl.constexpr, WSEL: tl.constexpr, RANK: tl.constexpr,
              NJ: tl.constexpr, BLOCK_C: tl.constexpr):
    """z (NJ, BLOCK_C, RANK): the kept rows SEL of ys, weighted by WSEL (2 bits a row)."""
    zs = ()
    for t in tl.static_range(RANK):
        zs = zs + (_weighted(ys[(SEL >> (4 * t)) & 15], (WSEL >> (2 * t)) & 3),)
    return tl.reshape(_join_last(zs, RANK), (NJ, BLOCK_C, RANK))


@triton.jit
def _hla_z(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL: tl.constexpr, RANK: tl.constexpr,
           BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, IDX64: tl.constexpr,
           EVEN: tl.constexpr):
    """(z, d) of a fixed selection: z (BLOCK_R/16, BLOCK_C, RANK) float32, z[j, c, t] =
    sum_i T_r[t, i] x[16 j + i, c] over the tile's local blocks j (zero rows past R, zero
    columns past C); d (BLOCK_R/16, BLOCK_C) the unscaled Sylvester row 0, d[j, c] =
    sum_i x[16 j + i, c] (block sums)."""
    ys = _hla_ys(x_ptr, sxr, sxc, R, C, pid_r, pid_c, 0, False, BLOCK_R, BLOCK_C, IDX64, EVEN)
    return _hla_pick(ys, SEL, 0, RANK, BLOCK_R // 16, BLOCK_C), ys[0]


@triton.jit
def _hla_full_amax(ys, BWSEL: tl.constexpr):
    """A drawn selection's absmax bits per column: the max over all 16 rows of ys, each row n
    weighted by its band's code (BWSEL, 2 bits a Sylvester row), and over the blocks."""
    # Rounding w * |y| is monotonic in |y| and NaN stays NaN, so the max of the weighted rows is
    # the weighted max of each band's rows: one multiply per band, not per row (the same value).
    a = tl.zeros(ys[0].shape, tl.int32)
    for code in tl.static_range(3):
        m = tl.zeros(ys[0].shape, tl.int32)
        for n in tl.static_range(16):
            if ((BWSEL >> (2 * n)) & 3) == code:
                m = tl.maximum(m, _abs_bits(ys[n]))
        a = tl.maximum(a, _abs_bits(_weighted(m.to(tl.float32, bitcast=True), code)))
    return tl.max(a, axis=0)


@triton.jit
def _hla_u(cols, jb, LR, key, NJ: tl.constexpr, BLOCK_C: tl.constexpr, RANK: tl.constexpr,
           IDX64: tl.constexpr):
    """u (NJ, BLOCK_C, RANK) of the HLA codes at c * LR + jb * RANK + t, joined like _hla_z's
    z: for RANK >= 2 the slabs t = 2p, 2p + 1 are one pair (LR and jb * RANK are even), one hash
    each; for RANK 1 one hash per code."""
    if RANK >= 2:
        pair0 = ((_idx(cols[None, :], IDX64) * LR + (jb * RANK)[:, None]) >> 1).to(tl.uint32)
        u = tl.reshape(_join_last(_u_pairs_last(pair0, key, RANK), RANK), (NJ, BLOCK_C, RANK))
    else:
        u = tl.reshape(_u_at(_idx(cols[None, :], IDX64) * LR + jb[:, None], key), (NJ, BLOCK_C, 1))
    return u


# ---------------------------------------------------------------- the two kernels


@triton.jit
def stats_kernel(
    x_ptr, sxr, sxc, R, C, hq_amax_ptr, hla_amax_ptr, bsum_ptr,
    RANK: tl.constexpr, SEL: tl.constexpr, DRAW: tl.constexpr, BWSEL: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    DO_BSUM: tl.constexpr, DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, IDX64: tl.constexpr,
    EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """The atomic max of |t|'s bits per scale group (module docstring). DO_BSUM (with
    DO_HLA): also the tile's column sums of x in float32, bsum[c, pid_r] (one store per column,
    no atomics, so the sum over pid_r that follows is deterministic), column-major so that sum
    is an inner-axis reduction."""
    tl.static_assert((not DO_BSUM) or DO_HLA)
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    if DO_HQ:
        # Padding columns (C <= col < C16) count as zeros; blocks past C16 change no max.
        t = _hq_t_dot(x_ptr, sxr, sxc, R, C, pid_r, pid_c, BLOCK_R, BLOCK_C, DOT_DTYPE,
                      PREC, IDX64, EVEN)
        rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        a = tl.max(_abs_bits(t), axis=1)
        if HQ_ROW:
            tl.atomic_max(hq_amax_ptr + rows, a, mask=rows < R, sem="relaxed")
        else:
            tl.atomic_max(hq_amax_ptr, tl.max(a, axis=0), sem="relaxed")
    if DO_HLA:
        cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        if DRAW:
            ys = _hla_ys(x_ptr, sxr, sxc, R, C, pid_r, pid_c, 0, False, BLOCK_R, BLOCK_C,
                         IDX64, EVEN)
            a = _hla_full_amax(ys, BWSEL)
            d = ys[0]
        else:
            z, d = _hla_z(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL, RANK, BLOCK_R, BLOCK_C,
                          IDX64, EVEN)
            a = tl.max(tl.max(_abs_bits(z), axis=2), axis=0)
        if DO_BSUM:
            tl.store(bsum_ptr + _idx(cols, IDX64) * tl.num_programs(0) + pid_r,
                     tl.sum(d, axis=0), mask=cols < C)
        if HLA_ROW:
            tl.atomic_max(hla_amax_ptr + cols, a, mask=cols < C, sem="relaxed")
        else:
            tl.atomic_max(hla_amax_ptr, tl.max(a, axis=0), sem="relaxed")


@triton.jit(do_not_specialize=["hq_key", "hla_key", "hla_draw"])
def quantize_kernel(
    x_ptr, sxr, sxc, R, C, hq_amax_ptr, hla_amax_ptr,
    hq_q_ptr, hq_s_ptr, C16, hq_key,
    hla_q_ptr, hla_s_ptr, LR, NBLK, hla_key, hla_draw, step_ptr,
    USE_STEP: tl.constexpr, RANK: tl.constexpr, SEL: tl.constexpr, DRAW: tl.constexpr,
    WSEL: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr, HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr,
    IDX64: tl.constexpr, EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Codes and scales of one tile: scale = amax / qmax (1 where amax == 0), v = t * (1 /
    scale), codes by _round with u of the code's row-major index in q; the keys of the two
    streams by _key (USE_STEP: from the step counter at step_ptr), and so is a drawn
    selection's (DRAW) from hla_draw. Compile with enable_fp_fusion=False."""
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    if DO_HQ:
        _hq_quantize_tile(x_ptr, sxr, sxc, R, C, hq_amax_ptr, hq_q_ptr, hq_s_ptr, C16, hq_key,
                          step_ptr, pid_r, pid_c, USE_STEP, HQ_ROW, HQ_QMAX, HQ_STOCH, IDX64,
                          EVEN, BLOCK_R, BLOCK_C)
    if DO_HLA:
        _hla_quantize_tile(x_ptr, sxr, sxc, R, C, hla_amax_ptr, hla_q_ptr, hla_s_ptr, LR, NBLK,
                           hla_key, hla_draw, step_ptr, pid_r, pid_c, USE_STEP, RANK, SEL,
                           DRAW, WSEL, HLA_ROW, HLA_QMAX, HLA_STOCH, IDX64, EVEN, BLOCK_R,
                           BLOCK_C)


@triton.jit
def _hq_quantize_tile(x_ptr, sxr, sxc, R, C, hq_amax_ptr, hq_q_ptr, hq_s_ptr, C16, hq_key,
                      step_ptr, pid_r, pid_c, USE_STEP: tl.constexpr, HQ_ROW: tl.constexpr,
                      HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr, IDX64: tl.constexpr,
                      EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """quantize_kernel's HQ part: the tile's HQ codes (and, from the first column of tiles,
    the scales), computed on (P,) slabs, P = the tile's blocks of 16 (module docstring)."""
    ys, rows, c0, rmask = _hq_blocks(x_ptr, sxr, sxc, R, C, pid_r, pid_c, IDX64, EVEN, BLOCK_R,
                                     BLOCK_C)
    # One scale per block, not per element: the divisions run once per block a thread holds.
    r = _group_recip(hq_amax_ptr, hq_s_ptr, rows, rmask, pid_r, pid_c, HQ_ROW, True, HQ_QMAX)
    _hq_store(ys, r, rows, c0, rmask, hq_q_ptr, C16, hq_key, step_ptr, USE_STEP, HQ_QMAX,
              HQ_STOCH, IDX64, EVEN, BLOCK_R * (BLOCK_C // 16))


@triton.jit
def _hq_blocks(x_ptr, sxr, sxc, R, C, pid_r, pid_c, IDX64: tl.constexpr, EVEN: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """(ys, rows, c0, rmask): the tile's blocks of 16 as two 8-column halves, butterflied into
    16 slabs of (P,) (slab i = unscaled coefficient i of every block; times 1/4 is the HQ
    transform), with each block's row and first column."""
    NB: tl.constexpr = BLOCK_C // 16
    P: tl.constexpr = BLOCK_R * NB
    m = tl.arange(0, P)
    rows = pid_r * BLOCK_R + m // NB  # block m's row and first column
    c0 = pid_c * BLOCK_C + (m % NB) * 16
    rmask = rows < R
    i8 = tl.arange(0, 8)
    ptr = x_ptr + _idx(rows[:, None], IDX64) * sxr + _idx(c0[:, None] + i8[None, :], IDX64) * sxc
    if EVEN:
        lo = tl.load(ptr)
        hi = tl.load(ptr + 8 * sxc)
    else:
        lo = tl.load(ptr, mask=rmask[:, None] & (c0[:, None] + i8[None, :] < C), other=0.0)
        hi = tl.load(ptr + 8 * sxc, mask=rmask[:, None] & (c0[:, None] + 8 + i8[None, :] < C),
                     other=0.0)
    ys = _fwht16(_split_last(lo.to(tl.float32), P, 8) + _split_last(hi.to(tl.float32), P, 8))
    return ys, rows, c0, rmask


@triton.jit
def _hq_store(ys, r, rows, c0, rmask, hq_q_ptr, C16, hq_key, step_ptr, USE_STEP: tl.constexpr,
              HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr, IDX64: tl.constexpr,
              EVEN: tl.constexpr, P: tl.constexpr):
    """The HQ codes of _hq_blocks' slabs with reciprocal scales r (per block, or a scalar).

    v = t * r with t = y / 4 is formed as y * (r / 4): both scalings by 1/4 are exact (a power of
    two), so the product is the same float32 number, one multiply per element instead of two
    (where y / 4 or r / 4 would be subnormal, below 2^-126, they could differ by the rounding of
    that subnormal). The scale is the absmax of its row (or tensor): BOUNDED rounding."""
    r4 = r * 0.25
    vs = ()
    for i in tl.static_range(16):
        vs = vs + (ys[i] * r4,)
    if HQ_STOCH:  # a block's codes start at an even index: slabs 2p and 2p + 1 share a hash
        pair0 = ((_idx(rows, IDX64) * C16 + c0) >> 1).to(tl.uint32)
        us = _u_pairs_last(pair0, _key(hq_key, step_ptr, USE_STEP), 16)
    else:
        us = vs  # unused by nearest rounding
    qs = ()
    for i in tl.static_range(16):
        qs = qs + (_round(vs[i], us[i], HQ_QMAX, HQ_STOCH, True),)
    q = tl.reshape(_join_last(qs, 16), (P, 16))  # a block's codes leave in one 16-byte store
    off = _idx(rows[:, None], IDX64) * C16 + c0[:, None] + tl.arange(0, 16)[None, :]
    if EVEN:
        tl.store(hq_q_ptr + off, q)
    else:
        tl.store(hq_q_ptr + off, q, mask=rmask[:, None] & (c0[:, None] < C16))


@triton.jit
def _hla_quantize_tile(x_ptr, sxr, sxc, R, C, hla_amax_ptr, hla_q_ptr, hla_s_ptr, LR, NBLK,
                       hla_key, hla_draw, step_ptr, pid_r, pid_c, USE_STEP: tl.constexpr,
                       RANK: tl.constexpr, SEL: tl.constexpr, DRAW: tl.constexpr,
                       WSEL: tl.constexpr, HLA_ROW: tl.constexpr,
                       HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr, IDX64: tl.constexpr,
                       EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """quantize_kernel's HLA part: the tile's HLA codes (and, from the first row of tiles, the
    scales)."""
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    r = _group_recip(hla_amax_ptr, hla_s_ptr, cols, cmask, pid_r, pid_c, HLA_ROW, False,
                     HLA_QMAX)
    if DRAW:
        ys = _hla_ys(x_ptr, sxr, sxc, R, C, pid_r, pid_c, _key(hla_draw, step_ptr, USE_STEP),
                     True, BLOCK_R, BLOCK_C, IDX64, EVEN)
        z = _hla_pick(ys, SEL, WSEL, RANK, BLOCK_R // 16, BLOCK_C)
    else:
        z, _ = _hla_z(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL, RANK, BLOCK_R, BLOCK_C, IDX64,
                      EVEN)
    _hla_store(z, r, cols, cmask, pid_r, hla_q_ptr, LR, NBLK, hla_key, step_ptr, USE_STEP,
               RANK, HLA_ROW, HLA_QMAX, HLA_STOCH, IDX64, EVEN, BLOCK_R, BLOCK_C)


@triton.jit
def _hla_store(z, r, cols, wmask, pid_r, hla_q_ptr, LR, NBLK, hla_key, step_ptr,
               USE_STEP: tl.constexpr, RANK: tl.constexpr, HLA_ROW: tl.constexpr,
               HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr, IDX64: tl.constexpr,
               EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """The HLA codes of _hla_z's z with reciprocal scales r (per column, or a scalar), stored
    for the columns where ``wmask`` holds (EVEN with an all-true wmask: unmasked)."""
    if HLA_ROW:
        v = z * r[None, :, None]
    else:
        v = z * r
    # Code (block jb, coefficient t) of column c sits at c * LR + jb * RANK + t.
    jb = pid_r * (BLOCK_R // 16) + tl.arange(0, BLOCK_R // 16)
    tt = tl.arange(0, RANK)
    off = (_idx(cols[None, :, None], IDX64) * LR + (jb * RANK)[:, None, None]
           + tt[None, None, :])
    if HLA_STOCH:
        u = _hla_u(cols, jb, LR, _key(hla_key, step_ptr, USE_STEP), BLOCK_R // 16, BLOCK_C,
                   RANK, IDX64)
    else:
        u = v
    q = _round(v, u, HLA_QMAX, HLA_STOCH)
    if EVEN:
        tl.store(hla_q_ptr + off, q)
    else:
        tl.store(hla_q_ptr + off, q, mask=(jb < NBLK)[:, None, None] & wmask[None, :, None])


# ---------------------------------------------------------------- whole rows, one launch


@triton.jit(do_not_specialize=["hq_key", "hla_key", "hla_draw"])
def rows_kernel(
    x_ptr, sxr, sxc, R, C, hq_amax_ptr, hla_amax_ptr,
    hq_q_ptr, hq_s_ptr, C16, hq_key,
    hla_q_ptr, hla_s_ptr, LR, NBLK, hla_key, hla_draw, step_ptr,
    USE_STEP: tl.constexpr, HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PREC: tl.constexpr, IDX64: tl.constexpr, EVEN: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NCHUNK: tl.constexpr,
):
    """An HQ pass with per-row scales and no HLA part (a layer's W in a quantized forward) in
    one launch: program i holds rows i * BLOCK_R ... of every column, so a row's absmax needs
    no other program. Over its NCHUNK tiles of BLOCK_C columns it takes the rows' absmax of the
    transform as the stats kernel does (the same K = 16 dot on a tile of as many elements, so
    the same scales bit for bit), then forms the codes as quantize_kernel does (the tiles read
    again, from L2: this program just read them). No absmax workspace, no atomics, no second
    launch. The parameters are quantize_kernel's (QuantizeArgs: the C++ launch passes the same
    list); the absmax and HLA pointers are not read. Compile with enable_fp_fusion=False."""
    pid_r = tl.program_id(0)
    NB: tl.constexpr = BLOCK_C // 16
    P: tl.constexpr = BLOCK_R * NB
    rr = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    amax = tl.zeros((BLOCK_R,), tl.int32)
    for k in range(NCHUNK):
        t = _hq_t_dot(x_ptr, sxr, sxc, R, C, pid_r, k, BLOCK_R, BLOCK_C, DOT_DTYPE, PREC, IDX64,
                      EVEN)
        amax = tl.maximum(amax, tl.max(_abs_bits(t), axis=1))
    s = _scale(amax, HQ_QMAX)
    tl.store(hq_s_ptr + rr, s, mask=rr < R)
    # Each block's reciprocal scale, as (P,) like the blocks (block m is in tile row m // NB).
    r = tl.reshape(tl.broadcast_to(_recip(s)[:, None], (BLOCK_R, NB)), (P,))
    for k in range(NCHUNK):
        ys, rows, c0, rmask = _hq_blocks(x_ptr, sxr, sxc, R, C, pid_r, k, IDX64, EVEN, BLOCK_R,
                                         BLOCK_C)
        _hq_store(ys, r, rows, c0, rmask, hq_q_ptr, C16, hq_key, step_ptr, USE_STEP, HQ_QMAX,
                  HQ_STOCH, IDX64, EVEN, P)


# ---------------------------------------------------------------- one read, delayed HLA scale


@triton.jit
def _candidate(hist_ptr, cols, cmask, HLA_QMAX: tl.constexpr):
    """(c, s, ok) per column from the history h: c = MARGIN h, s = c / qmax, and whether h
    gives a candidate at all (h > 0, c finite), as quant.delayed_keep's first two tests."""
    h = tl.load(hist_ptr + cols, mask=cmask, other=0.0)
    c = h * _MARGIN
    return c, tl.math.div_rn(c, tl.full(c.shape, HLA_QMAX, tl.float32)), (h > 0.0) & (
        c < float("inf"))


@triton.jit
def _candidate_recip(hist_ptr, cols, cmask, HLA_QMAX: tl.constexpr):
    """1 / (MARGIN h / qmax) per column from the history h (quant.delayed_scale's
    candidate); 1 where h is 0 or the candidate not finite (such columns are redone by
    fixup_kernel, which decides with the same comparisons)."""
    _, s, ok = _candidate(hist_ptr, cols, cmask, HLA_QMAX)
    return _recip(tl.where(ok, s, 1.0))


@triton.jit
def _band_arrive(count_ptr):
    """Count this program in at its band's counter. The CTA barrier first, so every thread's
    atomics of this program precede the arrival, which releases them."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")


@triton.jit
def _band_wait(count_ptr, n):
    """Wait until all ``n`` programs of the band have arrived (each poll acquires their
    atomics)."""
    seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    while seen < n:
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit(do_not_specialize=["hq_key", "hla_key"])
def onepass_kernel(
    x_ptr, sxr, sxc, R, C, hq_amax_ptr, hla_amax_ptr, sync_ptr, hist_ptr, bsum_ptr,
    hq_q_ptr, hq_s_ptr, C16, hq_key, hla_q_ptr, LR, NBLK, hla_key, step_ptr, N_RT, N_CT,
    USE_STEP: tl.constexpr, RANK: tl.constexpr, SEL: tl.constexpr, DO_HQ: tl.constexpr,
    DO_BSUM: tl.constexpr, HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr,
    HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr, IDX64: tl.constexpr, EVEN: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """A pass with a delayed HLA scale (HLAArgs.history) from one read of each tile:

    HLA: codes with each column's candidate scale (_candidate_recip), the column's absmax of
    this pass folded into hla_amax (fixup_kernel then redoes the columns whose candidate is not
    kept and writes the scales); with DO_BSUM the tile's column sums, bsum[c, pid_r].
    HQ (DO_HQ, per-row scales): the band of N_CT programs that share a row of tiles folds its
    rows' absmax into hq_amax, counts in at the band's counter, does its HLA part, waits for
    the band (_band_wait) and quantizes the tile it still holds in registers with the
    complete rows' scales. Programs take their tile
    from a ticket (an atomic counter), so the programs of a band started in ticket order:
    every program of a band is running before any of the next band starts, and the bands
    complete as long as N_CT programs fit on the GPU at once (hot.fast.passes checks this
    from the compiled kernel's occupancy). Without DO_HQ the grid is (N_RT, N_CT) and
    nothing waits. sync_ptr: the bands' counters, then the ticket counter (zeroed with the
    pass). Compile with enable_fp_fusion=False."""
    if DO_HQ:
        ticket = tl.atomic_add(sync_ptr + N_RT, 1, sem="relaxed")
        pid_r = ticket // N_CT
        pid_c = ticket % N_CT
    else:
        pid_r = tl.program_id(0)
        pid_c = tl.program_id(1)
    if DO_HQ:
        # HQ first: the band's programs meet while this one does its HLA part.
        NB: tl.constexpr = BLOCK_C // 16
        ys, rows, c0, rmask = _hq_blocks(x_ptr, sxr, sxc, R, C, pid_r, pid_c, IDX64, EVEN,
                                         BLOCK_R, BLOCK_C)
        a = _abs_bits(ys[0] * 0.25)
        for i in tl.static_range(1, 16):
            a = tl.maximum(a, _abs_bits(ys[i] * 0.25))
        rr = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        tl.atomic_max(hq_amax_ptr + rr, tl.max(tl.reshape(a, (BLOCK_R, NB)), axis=1),
                      mask=rr < R, sem="relaxed")
        _band_arrive(sync_ptr + pid_r)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    z, d = _hla_z(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL, RANK, BLOCK_R, BLOCK_C, IDX64, EVEN)
    tl.atomic_max(hla_amax_ptr + cols, tl.max(tl.max(_abs_bits(z), axis=2), axis=0),
                  mask=cmask, sem="relaxed")
    if DO_BSUM:
        tl.store(bsum_ptr + _idx(cols, IDX64) * N_RT + pid_r, tl.sum(d, axis=0), mask=cmask)
    _hla_store(z, _candidate_recip(hist_ptr, cols, cmask, HLA_QMAX), cols, cmask, pid_r,
               hla_q_ptr, LR, NBLK, hla_key, step_ptr, USE_STEP, RANK, True, HLA_QMAX,
               HLA_STOCH, IDX64, EVEN, BLOCK_R, BLOCK_C)
    if DO_HQ:
        _band_wait(sync_ptr + pid_r, N_CT)
        # The complete maxima, read from L2 (.cg): this SM's L1 never held them.
        s = _scale(tl.load(hq_amax_ptr + rows, mask=rmask, other=0, cache_modifier=".cg"),
                   HQ_QMAX)
        if pid_c == 0:
            tl.store(hq_s_ptr + rows, s, mask=rmask & (c0 == 0))
        _hq_store(ys, _recip(s), rows, c0, rmask, hq_q_ptr, C16, hq_key, step_ptr, USE_STEP,
                  HQ_QMAX, HQ_STOCH, IDX64, EVEN, BLOCK_R * NB)


@triton.jit(do_not_specialize=["hla_key"])
def fixup_kernel(
    x_ptr, sxr, sxc, R, C, hla_amax_ptr, hist_ptr, count_ptr, hla_q_ptr, hla_s_ptr, LR, NBLK,
    hla_key, step_ptr, N_RT,
    USE_STEP: tl.constexpr, RANK: tl.constexpr, SEL: tl.constexpr, HLA_QMAX: tl.constexpr,
    HLA_STOCH: tl.constexpr, IDX64: tl.constexpr, EVEN: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """After onepass_kernel, program (g, pid_c) for rows of tiles g, g + G, ... (G = the grid's
    first size): each column's scale by quant.delayed_scale from its now complete absmax a and
    its history h (written by g = 0); the codes of the columns whose candidate is not kept
    quantized again with a's scale (only tiles that hold such a column are read); then h = a,
    stored by the last program of the column of tiles to count in (count_ptr, zeroed with the
    pass), once every program of that column has read h."""
    g = tl.program_id(0)
    pid_c = tl.program_id(1)
    n_g = tl.num_programs(0)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    a_bits = tl.load(hla_amax_ptr + cols, mask=cmask, other=0)
    a = a_bits.to(tl.float32, bitcast=True)
    c, s_c, ok = _candidate(hist_ptr, cols, cmask, HLA_QMAX)
    keep = ok & (a <= c) & (a * _RANGE >= c)
    s = tl.where(keep, s_c, _scale(a_bits, HLA_QMAX))
    if g == 0:
        tl.store(hla_s_ptr + cols, s, mask=cmask)
    redo = (~keep) & cmask
    if tl.sum(redo.to(tl.int32), axis=0) > 0:
        r = _recip(s)
        for pid_r in range(g, N_RT, n_g):
            z, _ = _hla_z(x_ptr, sxr, sxc, R, C, pid_r, pid_c, SEL, RANK, BLOCK_R, BLOCK_C,
                          IDX64, False)
            _hla_store(z, r, cols, redo, pid_r, hla_q_ptr, LR, NBLK, hla_key, step_ptr,
                       USE_STEP, RANK, True, HLA_QMAX, HLA_STOCH, IDX64, False, BLOCK_R,
                       BLOCK_C)
    n = tl.atomic_add(count_ptr + pid_c, 1, sem="acq_rel")
    if n == n_g - 1:
        tl.store(hist_ptr + cols, a, mask=cmask)
