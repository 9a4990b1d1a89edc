"""Break the g_y pass down on a GPU: the stats kernel alone, the quantize kernel alone, both, and
the host time of one call, against the pass's floor.

    python benchmarks/gy_pass_breakdown.py [--tiles 64,64,4 32,64,4 ...] [--ablate] [--weights]
        [--ncu]

Floor = (one read of g_y in bf16 + the HQ codes + the HLA codes) / copy bandwidth, as in
hot.bench.backward. --tiles times the two kernels of the g_y pass and of the ABC pass on other
quantizer tiles (ViT-B and Llama shapes).
--ablate times each kernel with one part (HQ or HLA) and with nearest instead of stochastic
rounding: where the quantize kernel's time goes (the same bytes are read in every variant).
--delayed times the passes with a delayed HLA scale (HLAConfig(amax="delayed"): one read of
each tile, onepass_kernel then fixup_kernel) against the current two-kernel passes, for the g_y
pass (HQ + HLA) and the ABC pass (HLA alone), in steady state (histories of earlier passes over
inputs of the same distribution, so no column is redone) and on a first pass (all redone).
--weights times the quantized forward's W pass (HQ 8-bit per output channel, nearest, float32
W; ViT-B's and Llama-1b's shapes) as rows_kernel's one launch against the stats and quantize
kernels with their workspace memset, in GPU microseconds from CUDA-graph replays (no host time),
and checks both give the same codes and scales.
--ncu runs each shape's two kernels once between cudaProfilerStart and Stop (after a warm-up
that compiles them), for `ncu --profile-from-start off` (scripts/gpu_run.sh ncu).
"""
import argparse
import sys

import torch

from hot.bench.timing import bench, copy_bandwidth, host_us
from hot.common.ops import HLAArgs, HQArgs, ScaleMode
from hot.common.options import Tile, override
from hot.fast import passes
from hot.fast import quantize as fq

SHAPES = [(25216, 2304), (25216, 768), (4096, 28672)]
HQ = HQArgs(4, ScaleMode.ROW, True, 1)
HLA = HLAArgs(8, "lowpass", 8, ScaleMode.ROW, True, 2)
W_HQ = HQArgs(4, ScaleMode.ROW, True, 3)


def _parts(x, hq=HQ, hla=HLA):
    """(stats only, quantize only) launchers for x, with the arguments passes.pass_args builds
    (outputs allocated once); the two-kernel pass even for HQ alone (no rows_kernel)."""
    p = passes.plan_for(x, hq, hla, whole_rows=False)
    stats_args, quantize_args, _ = passes.pass_args(x, p, hq, hla)

    def stats():
        p.stats(p.grid, stats_args, p.stats_meta)

    stats()

    def quantize():
        p.quantize(p.grid, quantize_args, p.quantize_meta)

    return stats, quantize


TILE_SHAPES = [(25216, 768), (25216, 2304), (25216, 3072), (32768, 2048), (32768, 8192),
               (4096, 28672)]


def tiles(specs, shapes=TILE_SHAPES):
    """Each kernel of the g_y pass (HQ + HLA) and of the ABC pass (HLA alone) on each tile."""
    for r, c in shapes:
        x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
        for spec in specs:
            tile = Tile(*(int(v) for v in spec.split(",")))
            with override(tile=tile):
                st, qu = _parts(x)
                ast, aqu = _parts(x, None, HLA)
                print(f"{r}x{c} tile {spec:10s}: g_y stats {bench(st):.4f} + quantize "
                      f"{bench(qu):.4f} ms; ABC stats {bench(ast):.4f} + quantize "
                      f"{bench(aqu):.4f} ms", flush=True)


def ablate():
    for r, c in SHAPES:
        x = torch.randn(r, c, device="cuda", dtype=torch.bfloat16)
        for parts, hq, hla in (("both", HQ, HLA), ("HQ only", HQ, None), ("HLA only", None, HLA)):
            for stoch in (True, False):
                name = f"{parts}, {'stochastic' if stoch else 'nearest'}"
                st, qu = _parts(x, hq and hq._replace(stochastic=stoch),
                                hla and hla._replace(stochastic=stoch))
                print(f"{r}x{c} {name:22s}: stats {bench(st):.3f} ms, quantize "
                      f"{bench(qu):.3f} ms", flush=True)


DELAYED_SHAPES = [(25216, 768), (25216, 2304), (25216, 3072), (32768, 2048), (32768, 8192),
                  (4096, 28672)]


def delayed(shapes=DELAYED_SHAPES):
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    for r, c in shapes:
        gs = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        hist = torch.zeros(c, device="cuda")
        hla_d = HLA._replace(history=hist)
        floor_gy = (r * c * 2 + r * c + c * r // 2) / bw * 1e3
        floor_abc = (r * c * 2 + c * r // 2) / bw * 1e3
        cur = bench(lambda g: fq.gy_quantize(g, HQ, HLA), gs)
        fq.gy_quantize(gs[0][0], HQ, hla_d)
        p = passes.plan_for(gs[0][0], HQ, hla_d)
        band = p.delayed.band and fq._BAND_FITS.get(p.uid)
        dly = bench(lambda g: fq.gy_quantize(g, HQ, hla_d), gs)

        def first(g):
            hist.zero_()
            fq.gy_quantize(g, HQ, hla_d)

        fst = bench(first, gs)
        acur = bench(lambda g: fq.hla_quantize(g, HLA), gs)
        hist.zero_()
        fq.hla_quantize(gs[0][0], hla_d)
        adly = bench(lambda g: fq.hla_quantize(g, hla_d), gs)
        print(f"{r}x{c}: g_y pass current {cur:.3f} ms ({100 * floor_gy / cur:.0f}% of the "
              f"one-read floor {floor_gy:.3f}), delayed {dly:.3f} ms "
              f"({100 * floor_gy / dly:.0f}%; band {bool(band)}), first pass {fst:.3f}; ABC "
              f"current {acur:.3f} ms ({100 * floor_abc / acur:.0f}%), delayed {adly:.3f} ms "
              f"({100 * floor_abc / adly:.0f}%)", flush=True)


# (O, I) of ViT-B/16 (qkv, proj, fc1, fc2) and Llama-3.2-1B (q and o, k and v, gate and up, down).
W_SHAPES = [(2304, 768), (768, 768), (3072, 768), (768, 3072),
            (2048, 2048), (512, 2048), (8192, 2048), (2048, 8192)]


def graph_us(fn, sets, n=24):
    """GPU microseconds per call of fn(*sets[i % len(sets)]) over n calls captured in one CUDA
    graph (medians of 7 replays): what a CUDA-graph step pays, without host time."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for s in sets:
            fn(*s)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n):
            fn(*sets[i % len(sets)])
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / n)
    return sorted(ts)[3]


def weights(shapes=W_SHAPES):
    from hot.nn.forward import forward_args

    a = forward_args("int8")
    tot = [0.0, 0.0]
    for o, i in shapes:
        # Enough copies that a replay finds none of them in L2 (50 MB on an H100).
        sets = [(torch.randn(o, i, device="cuda"),) for _ in range(max(2, -(-(64 << 20) // (o * i * 4))))]
        one = passes.plan_for(sets[0][0], a, None)
        two = passes.plan_for(sets[0][0], a, None, whole_rows=False)
        assert one.rows and not two.rows
        r1, r2 = fq.run_pass(sets[0][0], one, a, None), fq.run_pass(sets[0][0], two, a, None)
        same = torch.equal(r1.hq_q, r2.hq_q) and torch.equal(r1.hq_s, r2.hq_s)
        t1 = graph_us(lambda w: fq.run_pass(w, one, a, None), sets)
        t2 = graph_us(lambda w: fq.run_pass(w, two, a, None), sets)
        if (o, i) in W_SHAPES[:4]:
            tot[0] += 12 * t1
            tot[1] += 12 * t2
        print(f"W {o}x{i} float32: rows_kernel {t1:.1f} us, stats + quantize (and memset) "
              f"{t2:.1f} us: {t2 / t1:.2f}x; same codes and scales: {same}", flush=True)
    print(f"ViT-B's 48 layers: {tot[0] / 1e3:.3f} ms against {tot[1] / 1e3:.3f} ms a step")


def ncu():
    runs = []
    for r, c in SHAPES:
        st, qu = _parts(torch.randn(r, c, device="cuda", dtype=torch.bfloat16))
        qu()
        runs += [st, qu]
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in runs:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiles", nargs="*", default=None)
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--delayed", action="store_true")
    ap.add_argument("--weights", action="store_true")
    a = ap.parse_args(argv)
    if a.weights:
        return weights()
    if a.delayed and a.tiles:
        for spec in a.tiles:  # the one-read passes on other tiles
            print(f"tile {spec}:", flush=True)
            with override(tile=Tile(*(int(v) for v in spec.split(",")))):
                delayed([(25216, 2304), (32768, 8192), (4096, 28672)])
        return 0
    if a.delayed:
        return delayed()
    if a.ncu:
        return ncu()
    if a.ablate:
        return ablate()
    if a.tiles:
        return tiles(a.tiles)
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    for r, c in SHAPES:
        gs = [(torch.randn(r, c, device="cuda", dtype=torch.bfloat16),) for _ in range(3)]
        floor = (r * c * 2 + r * c + c * r // 2) / bw * 1e3
        ms = bench(lambda g: fq.gy_quantize(g, HQ, HLA), gs)
        st, qu = _parts(gs[0][0])
        ms_st, ms_qu = bench(st), bench(qu)
        hu = host_us(lambda: fq.gy_quantize(gs[0][0], HQ, HLA))
        print(f"{r}x{c}: pass {ms:.3f} ms ({100 * floor / ms:.0f}% of copy; floor {floor:.3f}) = "
              f"stats {ms_st:.3f} + quantize {ms_qu:.3f}; host {hu:.0f} us", flush=True)
    w = torch.randn(2304, 768, device="cuda", dtype=torch.bfloat16)
    print(f"  w_pass 2304x768: {bench(lambda: fq.hq_quantize(w.t(), W_HQ)):.3f} ms, "
          f"host {host_us(lambda: fq.hq_quantize(w.t(), W_HQ)):.0f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
