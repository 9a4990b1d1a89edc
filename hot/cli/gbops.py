"""`hot gbops MODEL`: backward operation counts per layer for FP, HOT, LBP-WHT and LUQ."""

from __future__ import annotations

import argparse

import torch

from ..analysis import gbops as G
from ..analysis.shapes import layer_shapes
from . import argtypes as T
from .common import add_json_flag, emit, render_table
from .modelargs import add_model_args, build_for_analysis
from .trainer import logits_of


def add_parser(sub) -> None:
    p = sub.add_parser(
        "gbops", help="backward operation counts (GBOPs) per layer: FP, HOT, LBP-WHT, LUQ",
        description="Count forward and backward operations per Linear/Conv2d layer from one "
        "forward at --batch (layer shapes (L, O, I) are read with hooks). GBOPs are "
        "bit-operations / 1e9: an FP32 operation counts 32x32 = 1024, an INT8 MAC 64, an INT4 "
        "MAC 16, an INT4xINT8 MAC 32. FLOP columns are plain FLOPs (supplement Table 5). "
        "--convention official reproduces the official gbops_calculation.py, including its "
        "I*(r/n)*O term (Table 5 has I*L*r/n) and its LBP-WHT without a g_x GEMM.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    p.set_defaults(batch=1)
    p.add_argument("--rank", type=T.hla_rank, default=8, metavar="{1,2,4,8,16}",
                   help="HLA rank r (n = 16)")
    p.add_argument("--convention", choices=G.CONVENTIONS, default="table5",
                   help="table5: the paper supplement's formulas; official: the official "
                        "gbops_calculation.py's (docs/cli.md)")
    p.add_argument("--top", type=T.nonnegative_int, default=0,
                   help="show only the N costliest layers (0 = all)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    built, shape, make = build_for_analysis(args)
    x, _ = make(torch.device("cpu"), torch.Generator().manual_seed(0))
    shapes = layer_shapes(built.model, lambda m: logits_of(m, x))
    t = G.table(shapes, rank=args.rank, convention=args.convention)
    t.update({"model": args.model, "batch": args.batch, "input_shape": shape,
              "units": "GBOPs = bit-operations / 1e9 (FP32 op = 1024, INT8 MAC = 64, "
                       "INT4 MAC = 16, INT4xINT8 MAC = 32); *_flops fields are FLOPs"})
    layers = t["layers"]
    if args.top:
        layers = sorted(layers, key=lambda r: -r["fp_bwd_gbops"])[: args.top]
    rows = [[r["layer"], r["L"], r["O"], r["I"], r["forward_gbops"], r["fp_bwd_gbops"],
             r["hot_bwd_gbops"], r["lbp_wht_bwd_gbops"], r["luq_bwd_gbops"]] for r in layers]
    tot = t["total_gbops"]
    rows.append(["TOTAL", "", "", "", tot["forward"], tot["fp_backward"], tot["hot_backward"],
                 tot["lbp_wht_backward"], tot["luq_backward"]])
    text = render_table(["layer", "L", "O", "I", "fwd", "FP bwd", "HOT bwd", "LBP-WHT bwd",
                         "LUQ bwd"], rows)
    text += (f"\n\nGBOPs (bit-operations / 1e9), batch {args.batch}, r = {args.rank} of n = 16, "
             f"convention {args.convention}. HOT / FP backward = "
             f"{tot['hot_backward'] / tot['fp_backward']:.3f}.")
    emit(args, t, text)
    return 0
