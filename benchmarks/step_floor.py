"""The fastest training step HOT could reach on a GPU, from a measured profile and the bytes its
quantizer passes must move: the floor an end-to-end speed target is judged against
(docs/performance.md, "Floors of the end-to-end targets").

    python benchmarks/step_floor.py RECORD.json [RECORD.json ...] [--bandwidth 3.00e12]
                                    [--int8-tops 1414e12] [--l2-mib 50] [--target 1.3]

RECORDs: `hot bench step --profile` (hot.bench.e2e) JSON of one call (every ratio is taken within one call): the
HOT mode's kernel time by category (hot_pass, int8_gemm, other), the baselines' step medians
and GPU busy times. Every HOT mode in them gets its floor:

    floor = other + min(int8 GEMMs as measured, their operations at --int8-tops) + passes

where `other` is measured (what HOT leaves as bf16 runs it: forward GEMMs unless the forward is
quantized too, attention, norms, elementwise work, the optimizer) and the passes move their
bytes (hot.analysis.floor) at --bandwidth, the copy bandwidth the benchmarks measure: as
specified (each input read twice, the second read charged for what exceeds the L2, --l2-mib),
read once (a delayed or per-block scale), each also with one ABC pass per input that several
layers read ("shared inputs": q, k and v; gate and up), and not at all. For --target it prints
what the passes may take and what multiple of the copy bandwidth each form would then need. The
layers' shapes come from one forward of the model on the CPU (hot.analysis.shapes) at batch 1,
scaled to the record's batch.
"""
import argparse
import dataclasses
import functools
import json
import sys

import torch

from hot.analysis.floor import pass_bytes


@functools.lru_cache(maxsize=None)  # several HOT records of one model share their shapes
def layer_shapes(model: str, batch: int, seq):
    """The LayerShape of every Linear / Conv2d of one training forward of hot.bench.e2e's
    ``model`` at ``batch`` (and ``seq`` tokens), from a forward at batch 1 (8 tokens) on the
    CPU, L scaled up."""
    from hot.analysis.shapes import layer_shapes as shapes_of
    from hot.bench.e2e import Workload

    w = Workload(model, 1, 8 if model.startswith("llama") else None, "cpu")
    m = w.build()
    x = w.batches(m)[0][0][:1]
    scale = batch * seq // 8 if w.llm else batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shapes = shapes_of(m, (lambda mm: mm(input_ids=x)) if w.llm else (lambda mm: mm(x)))
    return tuple(dataclasses.replace(s, L=s.L * scale, x_numel=s.x_numel * scale) for s in shapes)


def floors(records, bw: float, int8_rate: float, l2: float, target: float) -> int:
    """Print each HOT record's floors against the baselines of the same records; the number
    of HOT records with a profile."""
    import hot

    base = next((r for r in records if r["mode"] == "bf16_compile"), None)
    refs = []
    if base:
        refs = [("bf16 median", base["step_ms"]), ("bf16 busy", base["profile"]["gpu_busy_ms"])]
    refs += [(f"{p['mode']} median", p["step_ms"]) for p in records
             if p["mode"].startswith("float8")]
    n = 0
    for r in records:
        cat = (r.get("profile") or {}).get("category_ms") or {}
        if not r["mode"].startswith("hot") or "int8_gemm" not in cat:
            continue
        n += 1
        pb = pass_bytes(layer_shapes(r["model"], r["batch"], r.get("seq")),
                        hot.HOTConfig().hla.rank, l2, qfwd=r.get("forward") == "int8")
        gemm = min(cat["int8_gemm"], pb.gemm_ops / int8_rate * 1e3)
        fixed = cat["other"] + gemm
        passes = {"as specified (two reads)": pb.spec, "read once": pb.one_read,
                  "as specified, shared inputs": pb.spec_shared,
                  "read once, shared inputs": pb.one_read_shared}
        print(f"{r['model']} batch {r['batch']}, {r['mode']} (HLA amax {r.get('hla_amax')}), "
              f"{r['device']}: GPU busy {r['profile']['gpu_busy_ms']:.2f} ms = other "
              f"{cat['other']:.2f} + int8 GEMMs {cat['int8_gemm']:.2f} (their operations at "
              f"{int8_rate / 1e12:.0f} TOP/s: {pb.gemm_ops / int8_rate * 1e3:.2f}) + passes "
              f"{cat['hot_pass']:.2f}; step median {r['step_ms']:.2f} ms")
        print("  pass bytes per step: " + ", ".join(f"{k} {v / 1e9:.1f} GB" for k, v in
                                                    passes.items()))
        rows = [("step median, as measured", r["step_ms"]),
                ("GPU busy, as measured", r["profile"]["gpu_busy_ms"])]
        rows += [(f"passes {k} at copy", fixed + v / bw * 1e3) for k, v in passes.items()]
        rows.append(("no passes at all", fixed))
        print(f"  {'HOT step':44s} {'ms':>8s}" + "".join(f" {'vs ' + k:>22s}" for k, _ in refs))
        for name, ms in rows:
            print(f"  {name:44s} {ms:8.2f}" + "".join(f" {ref / ms:21.3f}x" for _, ref in refs))
        if base:
            for k, ref in refs[:2]:
                budget = ref / target - fixed
                print(f"  {target}x of {k} ({ref:.2f} ms) leaves the passes {budget:.2f} ms with "
                      f"no host gaps: " + ", ".join(
                          f"{v / bw * 1e3 / budget if budget > 0 else float('inf'):.2f}x copy "
                          f"bandwidth {k2}" for k2, v in passes.items()))
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("records", nargs="+", help="hot.bench.e2e --profile JSON files of one call")
    ap.add_argument("--bandwidth", type=float, default=3.00e12, help="copy bandwidth, bytes/s")
    ap.add_argument("--int8-tops", type=float, default=1414e12,
                    help="int8 GEMM rate, operations/s (the highest the benchmarks measured)")
    ap.add_argument("--l2-mib", type=float, default=50.0, help="L2 size, MiB")
    ap.add_argument("--target", type=float, default=1.3, help="speed-up asked over bf16")
    a = ap.parse_args(argv)
    records = []
    for f in a.records:
        d = json.load(open(f))
        records += d if isinstance(d, list) else [d]
    if not floors(records, a.bandwidth, a.int8_tops, a.l2_mib * 2**20, a.target):
        print("no HOT record with a profile (hot.bench.e2e --profile) among the records",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
