"""A candidate for the quantize kernel's HQ part, beside the current one: the same codes from
column slabs loaded directly (slab i = column 16 j + i of every block, as the HLA part loads row
slabs), so the butterfly needs no split or join through shared memory.

    python benchmarks/hq_slabs.py check   # same codes and scales as quantize_kernel (any device)
    python benchmarks/hq_slabs.py count   # static SASS counts of both (sm_90, no GPU needed)
    python benchmarks/hq_slabs.py time    # both on a GPU: HQ-only passes of the breakdown shapes

The candidate computes exactly what quantize_kernel's HQ part computes (the same butterfly on
the same 16 values, the same scale, reciprocal, hash pairs and rounding), so ``check`` asks for
equal bits. It is a study, not the product: it joins hot/fast/kernels/quantize.py only once
``time`` shows it faster on the GPUs the project is measured on (docs/performance.md).
"""
import argparse
import sys

import torch
import triton
import triton.language as tl

from hot.common.ops import HQArgs, ScaleMode
from hot.common.options import Tile, override
from hot.fast import passes
from hot.common.ops import HLAArgs
from hot.fast.kernels.quantize import (_fwht16, _group_recip, _hla_quantize_tile, _idx,
                                       _join_last, _key, _mix32, _round, _u_hi, _u_lo)

HQ = HQArgs(4, ScaleMode.ROW, True, 123)
HLA = HLAArgs(8, "lowpass", 8, ScaleMode.ROW, True, 456)
SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]


@triton.jit(do_not_specialize=["hq_key", "hla_key"])
def hq_slab_kernel(
    x_ptr, sxr, sxc, R, C, hq_amax_ptr, hla_amax_ptr,
    hq_q_ptr, hq_s_ptr, C16, hq_key,
    hla_q_ptr, hla_s_ptr, LR, NBLK, hla_key, step_ptr,
    USE_STEP: tl.constexpr, RANK: tl.constexpr, SEL: tl.constexpr,
    DO_HQ: tl.constexpr, DO_HLA: tl.constexpr, HQ_ROW: tl.constexpr, HLA_ROW: tl.constexpr,
    HQ_QMAX: tl.constexpr, HQ_STOCH: tl.constexpr, HLA_QMAX: tl.constexpr, HLA_STOCH: tl.constexpr,
    IDX64: tl.constexpr, EVEN: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """quantize_kernel's signature and function: the HQ part from column slabs, the HLA part
    as quantize_kernel has it."""
    tl.static_assert(DO_HQ)
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    NB: tl.constexpr = BLOCK_C // 16
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    c0 = pid_c * BLOCK_C + 16 * tl.arange(0, NB)  # each block's first column
    base = x_ptr + _idx(rows[:, None], IDX64) * sxr + _idx(c0[None, :], IDX64) * sxc
    xs = ()
    for i in tl.static_range(16):
        if EVEN:
            xi = tl.load(base + i * sxc)
        else:
            xi = tl.load(base + i * sxc, mask=rmask[:, None] & (c0[None, :] + i < C), other=0.0)
        xs = xs + (xi.to(tl.float32),)
    ys = _fwht16(xs)
    r = _group_recip(hq_amax_ptr, hq_s_ptr, rows, rmask, pid_r, pid_c, HQ_ROW, True, HQ_QMAX)
    key = _key(hq_key, step_ptr, USE_STEP)
    pair0 = ((_idx(rows[:, None], IDX64) * C16 + c0[None, :]) >> 1).to(tl.uint32)
    qs = ()
    for p in tl.static_range(8):
        w = _mix32((pair0 + p) ^ key)  # codes 2p and 2p + 1 of each block share a hash
        for h in tl.static_range(2):
            t = ys[2 * p + h] * 0.25
            if HQ_ROW:
                v = t * r[:, None]
            else:
                v = t * r
            if h == 0:
                u = _u_lo(w)
            else:
                u = _u_hi(w)
            qs = qs + (_round(v, u, HQ_QMAX, HQ_STOCH),)
    q = tl.reshape(_join_last(qs, 16), (BLOCK_R, NB, 16))  # a block's 16 codes together
    off = (_idx(rows[:, None, None], IDX64) * C16 + c0[None, :, None]
           + tl.arange(0, 16)[None, None, :])
    if EVEN:
        tl.store(hq_q_ptr + off, q)
    else:
        tl.store(hq_q_ptr + off, q, mask=rmask[:, None, None] & (c0[None, :, None] < C16))
    if DO_HLA:  # quantize_kernel's HLA part, unchanged
        _hla_quantize_tile(x_ptr, sxr, sxc, R, C, hla_amax_ptr, hla_q_ptr, hla_s_ptr, LR, NBLK,
                           hla_key, step_ptr, pid_r, pid_c, USE_STEP, RANK, SEL, HLA_ROW,
                           HLA_QMAX, HLA_STOCH, IDX64, EVEN, BLOCK_R, BLOCK_C)


def _both(x, hq=HQ, hla=None):
    """(current launcher, candidate launcher, current outputs, candidate outputs) for a pass
    over x (HQ, and HLA when given); the stats kernel has run for both."""
    p = passes.plan_for(x, hq, hla)
    out = []
    runs = []
    for fn in (None, hq_slab_kernel):
        st, qa, o = passes.pass_args(x, p, hq, hla)
        p.stats(p.grid, st, p.stats_meta)
        if fn is None:
            run = lambda qa=qa: p.quantize(p.grid, qa, p.quantize_meta)
        else:
            run = lambda qa=qa: hq_slab_kernel[p.grid](*qa, **p.quantize_meta.kw)
        run()
        runs.append(run)
        out.append(o)
    return runs[0], runs[1], out[0], out[1]


def check(device) -> int:
    bad = 0
    for shape in [(128, 64), (70, 40), (96, 200), (33, 17)]:
        for dtype in (torch.float32, torch.bfloat16):
            x = (torch.randn(*shape) * 3).to(dtype).to(device)
            x[: max(1, shape[0] // 5)] *= 30
            for stoch, hla in ((True, None), (False, None), (True, HLA)):
                _, _, a, b = _both(x, HQ._replace(stochastic=stoch), hla)
                same = all(u is None and v is None or torch.equal(u, v)
                           for u, v in zip(a[:4], b[:4]))
                bad += not same
                print(f"{shape} {dtype} stochastic={stoch} HLA={hla is not None}: "
                      f"{'same' if same else 'DIFFERENT'}")
    return 1 if bad else 0


def count() -> int:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from sass_count import compile_kernel, counts

    hla_args = (8, "lowpass", 8, ScaleMode.ROW, True)
    for tile in ((64, 64, 4), (32, 128, 4), (64, 128, 4)):
        per = tile[0] * tile[1] / (32 * tile[2])
        for parts, hla in (("HQ", None), ("HQ+HLA", hla_args)):
            with override(tile=Tile(*tile), autotune=False):
                p = passes._plan(4096, 4096, (4096, 1), torch.bfloat16, torch.device("cuda"),
                                 (4, ScaleMode.ROW, True), hla, False, True)
                current = passes._launchers()[1].fn
                for name, fn in (("current", current), ("slabs", hq_slab_kernel)):
                    k = compile_kernel(fn, p.quantize_meta, "*bf16")
                    c = counts(k)
                    print(f"tile {tile} {parts:6s} {name:8s}: {sum(c.values()) / per:5.1f} per "
                          f"element, layout conversions "
                          f"{k.asm['ttgir'].count('ttg.convert_layout')}, shared memory "
                          f"{c['LDS'] + c['STS']}, barriers {c['BAR']}, MUFU {c['MUFU']}",
                          flush=True)
    return 0


def time_both() -> int:
    from hot.bench.timing import bench, copy_bandwidth

    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy {bw / 1e12:.2f} TB/s")
    for r, c in SHAPES:
        x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
        for parts, hla, extra in (("HQ", None, 0), ("HQ+HLA", HLA, c * r // 2)):
            cur, cand, a, b = _both(x, HQ, hla)
            floor = (2 * r * c + r * c + extra) / bw * 1e3  # read g_y, write the codes
            t0, t1 = bench(cur), bench(cand)
            print(f"{r}x{c} {parts}: quantize current {t0:.3f} ms, slabs {t1:.3f} ms (floor "
                  f"{floor:.3f}); same codes {torch.equal(a.hq_q, b.hq_q)}", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("check", "count", "time"))
    a = ap.parse_args(argv)
    if a.what == "count":
        return count()
    with override(tile=Tile(64, 64, 4), autotune=False):
        if a.what == "check":
            return check("cuda" if torch.cuda.is_available() else "cpu")
        return time_both()


if __name__ == "__main__":
    sys.exit(main())
