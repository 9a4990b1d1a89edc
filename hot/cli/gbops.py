"""`hot gbops MODEL`: operation counts per layer for the methods with a counting model: the
backward, and the forward where a method quantizes it."""

from __future__ import annotations

import argparse

import torch

from .. import recipes
from ..analysis import gbops as G
from ..analysis.shapes import layer_shapes
from . import argtypes as T
from .common import CLIError, add_json_flag, emit, method_recipe, render_table
from .modelargs import add_model_args, build_for_analysis
from .trainer import logits_of


DEFAULT_METHODS = "fp32,hot,lbp-wht,luq"


def columns(names: list[str], rank) -> dict:
    """The table's columns: each method's counting model (its recipe's Cost.gbops), HLA rank
    (``rank``, else the recipe's own) and the width of its quantized forward (the recipe's F
    operands; None: exact); CLIError for a method without a counting model."""
    out = {}
    for name in names:
        r = method_recipe(name)
        if r.cost.gbops is None:
            counted = [x.name for x in recipes.RECIPES.values() if x.cost.gbops is not None]
            raise CLIError(f"--methods {name}: no operation-count model describes it; choose "
                           f"from {', '.join(counted)}.")
        out[name] = (r.cost.gbops, rank or r.rank or 8, r.gemms.F.bits)
    return out


def add_parser(sub) -> None:
    p = sub.add_parser(
        "gbops", help="operation counts (GBOPs) per layer and method",
        description="Count forward and backward operations per Linear/Conv2d layer from one "
        "forward at --batch (layer shapes (L, O, I) are read with hooks). GBOPs are "
        "bit-operations / 1e9: an FP32 operation counts 32x32 = 1024, an INT8 MAC 64, an INT4 "
        "MAC 16, an INT4xINT8 MAC 32. FLOP columns are plain FLOPs (supplement Table 5). "
        "--convention official reproduces the official gbops_calculation.py, including its "
        "I*(r/n)*O term (Table 5 has I*L*r/n) and its LBP-WHT without a g_x GEMM.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    p.set_defaults(batch=1)
    counted = [r.name for r in recipes.RECIPES.values() if r.cost.gbops is not None]
    p.add_argument("--methods", type=T.method_list, default=DEFAULT_METHODS,
                   help=f"comma-separated methods with a counting model: {', '.join(counted)}")
    p.add_argument("--rank", type=T.hla_rank, default=None, metavar="{1,2,4,8,16}",
                   help="HLA rank r (n = 16) of every method (default: each method's own)")
    p.add_argument("--convention", choices=G.CONVENTIONS, default="table5",
                   help="table5: the paper supplement's formulas; official: the official "
                        "gbops_calculation.py's (docs/cli.md)")
    p.add_argument("--top", type=T.nonnegative_int, default=0,
                   help="show only the N costliest layers (0 = all)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    cols = columns(args.methods, args.rank)
    built, shape, make, _ = build_for_analysis(args)
    x, _ = make(torch.device("cpu"), torch.Generator().manual_seed(0))
    shapes = layer_shapes(built.model, lambda m: logits_of(m, x))
    rank = args.rank or 8
    t = G.table(shapes, rank=rank, convention=args.convention, columns=cols)
    t.update({"model": args.model, "batch": args.batch, "input_shape": shape,
              "methods": {m: {"model": c[0], "rank": c[1], "forward_bits": c[2]}
                          for m, c in cols.items()},
              "units": "GBOPs = bit-operations / 1e9 (FP32 op = 1024, INT8 MAC = 64, "
                       "INT4 MAC = 16, INT4xINT8 MAC = 32); *_flops fields are FLOPs"})
    layers = t["layers"]
    if args.top:
        layers = sorted(layers, key=lambda r: -r["fp_bwd_flops"])[: args.top]
    qf = [m for m, c in cols.items() if c[2]]  # methods whose forward is quantized
    rows = [[r["layer"], r["L"], r["O"], r["I"], r["forward_gbops"],
             *[r[f"{m}_fwd_gbops"] for m in qf], *[r[f"{m}_bwd_gbops"] for m in cols]]
            for r in layers]
    tot = t["total_gbops"]
    rows.append(["TOTAL", "", "", "", tot["forward"], *[tot[f"{m}_forward"] for m in qf],
                 *[tot[f"{m}_backward"] for m in cols]])
    text = render_table(["layer", "L", "O", "I", "fwd", *[f"{m} fwd" for m in qf],
                         *[f"{m} bwd" for m in cols]], rows)
    fp = next((m for m, c in cols.items() if c[0] == "fp"), None)
    step = lambda m: tot.get(f"{m}_forward", tot["forward"]) + tot[f"{m}_backward"]  # noqa: E731
    ratios = "" if fp is None else " " + ", ".join(
        f"{m} / {fp} backward = {tot[f'{m}_backward'] / tot[f'{fp}_backward']:.3f}"
        + (f" (forward + backward {step(m) / step(fp):.3f})" if m in qf else "")
        for m in cols if m != fp) + "."
    text += (f"\n\nGBOPs (bit-operations / 1e9), batch {args.batch}, n = 16, ranks "
             + ", ".join(f"{m} {c[1]}" for m, c in cols.items() if c[0] != "fp")
             + f", convention {args.convention}.{ratios}")
    emit(args, t, text)
    return 0
