"""Per-layer backward benchmark: one HOT layer (fast backend, every kernel included) against the
autograd backward of F.linear in FP32, TF32 and BF16, with a stage breakdown and each stage's floor.

    python -m hot.bench.backward [--shapes vitb,llama] [--json out.json] [--md out.md]

Layer shapes (L tokens x O outputs x I inputs): ViT-B/16 at batch 128 (L = 128 * 197) and
Llama-8B at 4096 tokens. HOT runs HOTConfig() (``hot``: unbiased HLA rows drawn per block, HQ's
width following the GPU) with its stage breakdown, and the paper's setting (``paper``: HQ
4-bit, the fixed low-pass HLA rows) in the same run, both on bf16 activations.

Stages of the HOT backward and their floors (bytes over the measured copy bandwidth, operations
over the measured int8 GEMM rate at 8192^3, whichever is larger):
    gy_pass : g_y (L x O bf16) -> HQ codes (L x O16 int8) + HLA codes (O x L/2 int8)
              (two reads of g_y: the absmax scales need a global reduction; floor counts one)
    w_pass  : W^T (I x O bf16) -> HQ codes (I x O16 int8)
    gemm_gx : (L x O16) . (I x O16)^T int8 -> g_x (L x I bf16)
    gemm_gw : (O x L/2) . (I x L/2)^T int8 -> g_W (O x I bf16)
Forward overhead of ABC: hla_quantize(x) against the bf16 forward GEMM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .argparser import BenchParser, UsageErrorFactory
from .timing import bench, copy_bandwidth, env_info, int8_rate, matmul_rate

SHAPES = {
    "vitb": [("vitb_qkv", 25216, 2304, 768), ("vitb_proj", 25216, 768, 768),
             ("vitb_fc1", 25216, 3072, 768), ("vitb_fc2", 25216, 768, 3072)],
    "llama": [("llama8b_qkv", 4096, 6144, 4096), ("llama8b_o", 4096, 4096, 4096),
              ("llama8b_gate_up", 4096, 28672, 4096), ("llama8b_down", 4096, 4096, 14336)],
}
N_SETS = 3  # rotating input sets: every shape's inputs total more than the L2


def _baseline(L, O, I, dtype, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    sets = []
    for _ in range(N_SETS):
        x = torch.randn(L, I, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(O, I, device="cuda", dtype=dtype, requires_grad=True) / I**0.5
        y = F.linear(x, w)
        sets.append((y, x, w, torch.randn_like(y)))
    ms = bench(lambda y, x, w, g: torch.autograd.grad(y, (x, w), g, retain_graph=True), sets)
    torch.backends.cuda.matmul.allow_tf32 = False
    return ms


class StageArgs(NamedTuple):
    """The quantizer arguments of one Linear layer's backward stages, timed one by one."""

    hq: "ops.HQArgs"  # g_y's HQ (g_x path)
    hq_w: "ops.HQArgs"  # W^T's HQ
    hla: "ops.HLAArgs"  # g_y's HLA (g_W path)
    hla_x: "ops.HLAArgs"  # x's HLA (ABC)


def stage_args(cfg, token: bool, device) -> StageArgs:
    """The stages' arguments for ``cfg`` as a Linear layer on ``device`` runs it (HLA's
    selection "auto" and HQ's bits "auto" resolved); ``token``: LQS chose per-token g_y scales."""
    from hot.common import ops
    from hot.common.config import DRAWN_SELECTIONS, hq_bits

    run = cfg.for_layer(conv=False)
    h, bits = run.hla, hq_bits(run.hq.bits, device)
    mode = ops.ScaleMode.ROW if token else ops.ScaleMode.TENSOR
    draw = 5 if h.selection in DRAWN_SELECTIONS else None
    hla = ops.HLAArgs(h.rank, h.selection, h.bits, ops.ScaleMode.ROW, True, 2, None, draw)
    return StageArgs(ops.HQArgs(bits, mode, True, 1), ops.HQArgs(bits, ops.ScaleMode.ROW, True, 3),
                     hla, hla._replace(seed=4))


def _hot(L, O, I, cfg):
    import hot
    from hot.common import ops
    from hot.fast import gemm

    sets, layers = [], []
    for i in range(N_SETS):
        lin = torch.nn.Linear(I, O, bias=False, device="cuda", dtype=torch.bfloat16)
        layer = hot.convert(torch.nn.Sequential(lin), cfg, backend="fast")[0]
        x = torch.randn(L, I, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        y = layer(x)
        g = torch.randn_like(y)
        torch.autograd.grad(y, (x, layer.weight), g, retain_graph=True)  # LQS calibration step
        sets.append((y, x, layer.weight, g))
        layers.append(layer)
    out = {"total": bench(lambda y, x, w, g: torch.autograd.grad(y, (x, w), g, retain_graph=True),
                          sets)}
    token = int(layers[0].hot_lqs) != 0
    out["lqs"] = "token" if token else "tensor"
    hq, hq_w, hla, hla_x = stage_args(cfg, token, "cuda")
    gys = [s[3] for s in sets]
    out["gy_pass"] = bench(lambda g: ops.gy_quantize(g, hq, hla, "fast"), [(g,) for g in gys])
    ws = [s[2] for s in sets]
    out["w_pass"] = bench(lambda w: ops.hq_quantize(w.t(), hq_w, "fast"), [(w,) for w in ws])
    ops_in = []
    for g, w, x in zip(gys, ws, [s[1] for s in sets]):
        (qg, sg), (qh, sh) = ops.gy_quantize(g, hq, hla, "fast")
        qw, sw = ops.hq_quantize(w.t(), hq_w, "fast")
        qx, sx = ops.hla_quantize(x.detach(), hla_x, "fast")
        ops_in.append((qg, sg, qw, sw, qh, sh, qx, sx))
    out["gemm_gx"] = bench(lambda qg, sg, qw, sw, *r: gemm.int_gemm_nt(qg, qw, sg, sw, torch.bfloat16),
                           ops_in)
    out["gemm_gw"] = bench(lambda *r: gemm.int_gemm_nt(r[4], r[6], r[5], r[7], torch.bfloat16), ops_in)
    out["path_gx"] = gemm.gemm_path(ops_in[0][0], ops_in[0][2])
    out["path_gw"] = gemm.gemm_path(ops_in[0][4], ops_in[0][6])
    xs = [(s[1].detach(),) for s in sets]
    out["abc_fwd"] = bench(lambda x: ops.hla_quantize(x, hla_x, "fast"), xs)
    out["bf16_fwd"] = bench(lambda x, w: F.linear(x, w), [(s[1].detach(), s[2].detach()) for s in sets])
    return out


def _floors(L, O, I, bw, int8_ops):
    o16, lr = math.ceil(O / 16) * 16, math.ceil(L / 16) * 8
    t = lambda b: b / bw * 1e3  # noqa: E731  (ms)
    return {
        "gy_pass": t(L * O * 2 + L * o16 + O * lr + 4 * (L + O)),
        "w_pass": t(I * O * 2 + I * o16),
        "gemm_gx": max(2 * L * o16 * I / int8_ops * 1e3, t(L * o16 + I * o16 + 2 * L * I)),
        "gemm_gw": max(2 * O * lr * I / int8_ops * 1e3, t(O * lr + I * lr + 2 * O * I)),
        "abc_fwd": t(L * I * 2 + I * math.ceil(L / 16) * 8),
    }


def run(groups, log=print) -> dict:
    import hot

    cfg = hot.HOTConfig(seed=0)
    paper = hot.HOTConfig.paper().replace(seed=0)
    bw = copy_bandwidth()
    bf16 = matmul_rate()
    i8, i8_path = int8_rate()
    res = {"env": env_info(), "copy_TBps": bw / 1e12, "bf16_TFLOPs": bf16 / 1e12,
           "int8_TOPs": i8 / 1e12, "int8_path": i8_path, "layers": []}
    log(f"copy {bw/1e12:.2f} TB/s, bf16 {bf16/1e12:.0f} TFLOP/s, int8 ({i8_path}) {i8/1e12:.0f} TOP/s")
    for g in groups:
        for name, L, O, I in SHAPES[g]:
            r = {"layer": name, "L": L, "O": O, "I": I}
            r["fp32"] = _baseline(L, O, I, torch.float32, False)
            r["tf32"] = _baseline(L, O, I, torch.float32, True)
            r["bf16"] = _baseline(L, O, I, torch.bfloat16, False)
            r["hot"] = _hot(L, O, I, cfg)
            r["paper_stages"] = _hot(L, O, I, paper)
            r["paper"] = r["paper_stages"]["total"]
            r["floor"] = _floors(L, O, I, bw, i8)
            r["speedup_vs_bf16"] = r["bf16"] / r["hot"]["total"]
            r["speedup_vs_fp32"] = r["fp32"] / r["hot"]["total"]
            r["gy_pass_pct_copy"] = 100 * r["floor"]["gy_pass"] / r["hot"]["gy_pass"]
            res["layers"].append(r)
            log(f"{name}: hot {r['hot']['total']:.3f} ms  paper {r['paper']:.3f}  "
                f"bf16 {r['bf16']:.3f}  fp32 {r['fp32']:.3f}  "
                f"x{r['speedup_vs_bf16']:.2f} vs bf16")
            torch.cuda.empty_cache()
    geo = lambda k: math.exp(sum(math.log(r[k]) for r in res["layers"]) / len(res["layers"]))  # noqa
    res["geomean_speedup_vs_bf16"] = geo("speedup_vs_bf16")
    res["geomean_speedup_vs_fp32"] = geo("speedup_vs_fp32")
    return res


def markdown(res: dict) -> str:
    e = res["env"]
    lines = [f"GPU {e['gpu']} (sm_{e['sm']}, {e['sms']} SMs), driver {e['driver']}, torch {e['torch']}, "
             f"CUDA {e['cuda']}, triton {e['triton']}; copy {res['copy_TBps']:.2f} TB/s, bf16 "
             f"{res['bf16_TFLOPs']:.0f} TFLOP/s, int8 {res['int8_TOPs']:.0f} TOP/s ({res['int8_path']}).",
             "",
             "| layer | L×O×I | FP32 | TF32 | BF16 | paper | HOT | vs BF16 | vs FP32 | g_y pass (floor) "
             "| W pass (floor) | g_x GEMM (floor) | g_W GEMM (floor) | g_y pass % copy "
             "| ABC fwd / bf16 fwd |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["layers"]:
        h, f = r["hot"], r["floor"]
        lines.append(
            f"| {r['layer']} | {r['L']}×{r['O']}×{r['I']} | {r['fp32']:.3f} | {r['tf32']:.3f} | "
            f"{r['bf16']:.3f} | {r['paper']:.3f} | {h['total']:.3f} | {r['speedup_vs_bf16']:.2f}× | {r['speedup_vs_fp32']:.1f}× | "
            f"{h['gy_pass']:.3f} ({f['gy_pass']:.3f}) | {h['w_pass']:.3f} ({f['w_pass']:.3f}) | "
            f"{h['gemm_gx']:.3f} ({f['gemm_gx']:.3f}) | {h['gemm_gw']:.3f} ({f['gemm_gw']:.3f}) | "
            f"{r['gy_pass_pct_copy']:.0f}% | {h['abc_fwd']:.3f} / {h['bf16_fwd']:.3f} |")
    lines += ["", f"Geometric mean speed-up: {res['geomean_speedup_vs_bf16']:.2f}× vs BF16, "
              f"{res['geomean_speedup_vs_fp32']:.1f}× vs FP32 (times in ms, medians; GEMM paths: "
              + ", ".join(sorted({r['hot']['path_gx'] + '/' + r['hot']['path_gw'] for r in res['layers']}))
              + ")."]
    return "\n".join(lines)


def shape_groups(text: str) -> list[str]:
    """argparse type of --shapes: a comma list of SHAPES' groups, checked before any GPU work."""
    groups = [s for s in text.split(",") if s]
    for g in groups or [text]:  # an empty list names the text itself
        if g not in SHAPES:
            raise argparse.ArgumentTypeError(f"{g!r} is no shape group; give a comma list of "
                                             f"{', '.join(SHAPES)}.")
    return groups


def main(argv=None, usage_error: Optional[UsageErrorFactory] = None) -> int:
    p = BenchParser(prog="hot bench layer", description=__doc__.splitlines()[0],
                    usage_error=usage_error)
    p.add_argument("--shapes", type=shape_groups, default="vitb,llama",
                   help="comma list of: " + ",".join(SHAPES))
    p.add_argument("--json", default=None, help="write the results here (a new file)")
    p.add_argument("--md", default=None, help="write the Markdown table here (a new file)")
    a = p.parse_args(argv)
    for flag, path in (("--json", a.json), ("--md", a.md)):
        if path and os.path.exists(path):
            p.error(f"{flag} {path} exists: pass a new path (results are never overwritten).")
    if not torch.cuda.is_available():
        print(f"{p.prog}: error: it needs a CUDA GPU and none is visible here.", file=sys.stderr)
        return 2
    res = run(a.shapes)
    md = markdown(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
