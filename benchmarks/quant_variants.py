"""Time every quantize-kernel variant (HOT_FAST_QKERNEL, hot/fast/quant_kernels_v4.py) on a GPU and
check its codes against the "dot" kernel's.

    python benchmarks/quant_variants.py [--variants dot,bfly,...] [--tiles 64,64,4 64,64,8]

Cases: the fused g_y pass (HQ 4-bit per-token stochastic + HLA rank 8 INT8 per-column
stochastic) on ViT-B qkv (25216 x 2304), fc1 (25216 x 3072) and proj (25216 x 768) g_y in bf16,
and the W pass (HQ only) on W^T of qkv (a 2304 x 768 weight viewed transposed) in fp32 and bf16.
Per variant and case: "pass" = stats + quantize kernels, "quant" = the quantize kernel alone
(after one stats launch), each the median of >= 50 CUDA-event timings of one CUDA-graph replay
(so the host's launch time is not in it; graph capture failing falls back to eager calls),
after warm-up. "% floor" = (one read of x + the codes) / copy bandwidth over the pass time.
"diff" = codes differing from the "dot" variant's (HQ + HLA; expect 0 or a handful of boundary
flips, each by 1: tests/fast/_fast_diff.py), "max|d|" the largest difference.
A variant that fails to compile or run gets its error in its row; the script goes on.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from hot.bench.timing import copy_bandwidth
from hot.fast import arch
from hot.fast import quant as fq

HQ = (4, "row", True, 1)
HLA = (8, "lowpass", 8, "row", True, 2)
REPS = 60


def _cases():
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for name, (r, c) in (("qkv g_y", (25216, 2304)), ("fc1 g_y", (25216, 3072)),
                         ("proj g_y", (25216, 768))):
        out.append((f"{name} {r}x{c} bf16", torch.randn(r, c, device="cuda", generator=g)
                    .to(torch.bfloat16), HQ, HLA))
    w = torch.randn(2304, 768, device="cuda", generator=g)
    for dt in (torch.float32, torch.bfloat16):
        out.append((f"qkv W^T 768x2304 {str(dt)[6:]}", w.to(dt).t(), HQ, None))
    return out


def _floor_ms(x, hq, hla, bw):
    r, c = x.shape
    nbytes = x.numel() * x.element_size()
    if hq:
        nbytes += r * fq.pad_to(c)
    if hla:
        nbytes += c * fq.pad_to(r) // 16 * hla[0]
    return nbytes / bw * 1e3


def _quant_only(x, hq, hla):
    """A closure launching the quantize kernel alone (its stats launched once before)."""
    p = fq.plan_for(x, hq, hla)
    stats_args, quant_args, _ = fq.pass_args(x, p, hq, hla)
    p["stats"](p["grid"], stats_args, p["sw"])
    return lambda: p["quant"](p["grid"], quant_args, p["qsw"])


def _time(fn) -> float:
    """Median ms of REPS single runs of fn, each captured once in a CUDA graph and replayed
    between two events (eager calls if capture fails)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    run = fn
    try:
        gr = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm the stream-keyed workspace of this side stream before capture
            with torch.cuda.graph(gr, stream=s):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        gr.replay()
        torch.cuda.synchronize()
        run = gr.replay
    except Exception:  # noqa: BLE001 - timing only: fall back to eager launches
        torch.cuda.synchronize()
    ts = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def _diff(out, ref):
    n, m = 0, 0
    for a, b in zip(out, ref):
        if a is None or a.dtype != torch.int8:
            continue
        d = (a.to(torch.int16) - b.to(torch.int16)).abs()
        n += int((d != 0).sum())
        m = max(m, int(d.max()) if d.numel() else 0)
    return n, m


def _set(variant, tile):
    fq.QKERNEL_VARIANT = variant
    fq._FIXED = tile
    fq._kernels.cache_clear()
    fq._pass_plan.cache_clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(arch.QKERNELS))
    ap.add_argument("--tiles", nargs="*", default=[], help="BLOCK_R,BLOCK_C,warps (default: the module's)")
    a = ap.parse_args()
    variants = a.variants.split(",")
    tiles = [tuple(int(v) for v in t.split(",")) for t in a.tiles] or [fq._FIXED]
    t0 = time.time()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy {bw / 1e12:.2f} TB/s, torch {torch.__version__}, "
          f"triton {__import__('triton').__version__}", flush=True)
    cases = _cases()
    _set("dot", None)
    refs = [fq.gy_pass(x, hq, hla) for _, x, hq, hla in cases]
    rows = []
    for tile in tiles:
        for v in variants:
            _set(v, tile)
            tname = "default" if tile is None else "x".join(map(str, tile))
            for (name, x, hq, hla), ref in zip(cases, refs):
                tc = time.time()
                try:
                    out = fq.gy_pass(x, hq, hla)
                    torch.cuda.synchronize()
                    comp = time.time() - tc
                    nd, md = _diff(out, ref)
                    ms = _time(lambda: fq.gy_pass(x, hq, hla))
                    mq = _time(_quant_only(x, hq, hla))
                    fl = _floor_ms(x, hq, hla, bw)
                    rows.append(f"| {v} | {tname} | {name} | {ms:.4f} | {mq:.4f} | {100 * fl / ms:.0f}% "
                                f"| {nd} | {md} | {comp:.1f} |")
                except Exception as e:  # noqa: BLE001 - one variant's failure must not end the run
                    msg = " ".join(f"{type(e).__name__}: {e}".split())[:160].replace("|", "/")
                    rows.append(f"| {v} | {tname} | {name} | error | | | {msg} | | |")
                print(rows[-1], flush=True)
    _set(arch.QKERNEL, None)
    print("\n| variant | tile | case | pass ms | quant ms | % floor | diff | max\\|d\\| | 1st call s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"\ntotal {time.time() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
