"""Operation counts per layer: the backward of FP, HOT, LBP-WHT and LUQ, and the forward, exact
or quantized (HOTConfig.forward).

Units. A *bit-operation* (BOP) count weights every operation by the product of its operand
widths, as the official calculator (gbops_calculation.py) does: an FP32 multiply-accumulate or
any FP32 elementwise/transform operation = 32 x 32 = 1024 BOPs, an INT8 x INT8 MAC = 64, an
INT4 x INT4 MAC = 16, an INT4 x INT8 MAC = 32. GBOPs = BOPs / 1e9. The ``*_flops`` fields are
plain FLOP counts (a MAC = 2 FLOPs), in the supplement's Table 5 convention; they are not
bit-operations.

For one layer with GEMM shape (L, O, I) (see ``hot.analysis.shapes``), n = 16 (the Hadamard
block), r = HLA rank, lg = log2(n):

    FP forward                 L O I MACs
    quantized forward (hot.nn.forward, ``bits`` 8), counted as Table 5 counts HQ:
      2LI lg + 2OI lg + 2LI + 2OI + 2LO FLOPs   (HT of x and W along I, quantize, dequant y)
      L O I INT8 MACs
    FP backward                2 L O I MACs                     (g_x = g_y W, g_W = g_y^T x)
    HOT backward, Table 5:
      g_x overhead  2LO lg + 2IO lg + 2LO + 2IO   FLOPs         (HT of g_y and W, quantize)
      g_W overhead  2LI lg + 2LO lg + 2I(L r/n) + 2O(L r/n)     (HLA of x and g_y, quantize)
      dequant       2IO + 2LI
      GEMMs         L O I INT4 MACs (g_x)  +  O (L r/n) I INT8 MACs (g_W)
    HOT with a frozen weight (LoRA base layer): g_x overhead + 2LI dequant + the INT4 GEMM.
    LBP-WHT: transforms 2LO lg + 2LI lg, then both GEMMs in the r/n low-rank space in FP32:
      2 O (L r/n) I MACs (g_x is computed from the projected g_y and projected back).
    LUQ (as in the official calculator): 3 (L O + 2 O I + 2 L I) FP32 ops + 2 L O I INT4xINT8 MACs.

BOPs count operations, not FLOPs: every Table 5 term enters as (Table 5 FLOPs) / 2 operations,
the same unit as FP's 2 L O I MACs, then x 1024 for FP32. ``hot_overhead_flops`` is the plain
Table 5 sum (FLOPs). Convention 'official' reproduces the official calculator exactly: its HLA
quantization term is I (r/n) O where Table 5 has I L r/n, and its LBP-WHT count has no g_x GEMM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .shapes import LayerShape

FP32_OP = 32 * 32
INT8_MAC = 8 * 8
INT4_MAC = 4 * 4
INT4x8_MAC = 4 * 8
# The counting models; a recipe names the one that describes it (hot.recipes.Cost.gbops).
MODELS = ("fp", "hot", "lbp_wht", "luq")
CONVENTIONS = ("table5", "official")


@dataclass
class Counts:
    """FP32-op count ``fp_ops`` (transforms, quantization, FP GEMM MACs) and integer MACs."""

    fp_ops: float = 0.0
    int8_macs: float = 0.0
    int4_macs: float = 0.0
    int4x8_macs: float = 0.0

    @property
    def bops(self) -> float:
        return (self.fp_ops * FP32_OP + self.int8_macs * INT8_MAC + self.int4_macs * INT4_MAC
                + self.int4x8_macs * INT4x8_MAC)


def forward_counts(s: LayerShape, bits: Optional[int] = None, n: int = 16) -> Counts:
    """Forward counts of one layer: FP32 MACs, or with ``bits`` (HOTConfig.forward's width) the
    quantized forward: HQ of x and W along I, then the integer GEMM (module docstring)."""
    L, O, I = s.L, s.O, s.I
    if bits is None:
        return Counts(fp_ops=L * O * I)
    if bits != 8:
        raise ValueError(f"forward bits {bits!r}: the quantized forward is counted at 8 bits")
    lg = math.log2(n)
    return Counts(fp_ops=L * I * lg + O * I * lg + L * I + O * I + L * O, int8_macs=L * O * I)


def backward_counts(s: LayerShape, method: str, rank: int = 8, n: int = 16,
                    convention: str = "table5", hot_applies: bool = True) -> Counts:
    """Backward counts of one layer; ``hot_applies`` = False counts a layer HOT leaves exact
    (e.g. grouped convolutions) as FP. A frozen weight (s.trainable False) has no g_W path."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r}: use one of {CONVENTIONS}")
    L, O, I = s.L, s.O, s.I
    lg = math.log2(n)
    k = rank / n
    f = 1  # operations, i.e. Table 5's FLOPs / 2, the unit in which FP's 2 L O I MACs are counted
    gw = s.trainable
    if method == "fp" or (method == "hot" and not hot_applies):
        return Counts(fp_ops=(2 if gw else 1) * L * O * I)
    if method == "hot":
        gx_over = f * (L * O * lg + I * O * lg + L * O + I * O)
        if not gw:
            return Counts(fp_ops=gx_over + f * L * I, int4_macs=L * O * I)
        hla_q = I * k * O if convention == "official" else I * L * k
        gw_over = f * (L * I * lg + L * O * lg + hla_q + O * L * k)
        deq = f * (I * O + L * I)
        return Counts(fp_ops=gx_over + gw_over + deq, int4_macs=L * O * I, int8_macs=O * L * k * I)
    if method == "lbp_wht":
        gemms = (1 if convention == "official" else 2) * O * L * k * I
        return Counts(fp_ops=f * (L * O * lg + L * I * lg) + gemms)
    if method == "luq":
        return Counts(fp_ops=3 * (L * O + 2 * O * I + 2 * L * I), int4x8_macs=2 * L * O * I)
    raise ValueError(f"counting model {method!r}: use one of {MODELS}")


def table(shapes: list[LayerShape], rank: int = 8, convention: str = "table5",
          hot_applies=lambda s: s.groups == 1, columns: Optional[dict] = None) -> dict:
    """Per-layer and total GBOPs: the exact forward, and the backward for every column.
    ``columns`` maps a column's name to (counting model, HLA rank) or (counting model, HLA
    rank, forward bits), e.g. a recipe's name to its Cost.gbops, rank and quantized forward's
    width (None: exact); default: every model of MODELS under its own name at ``rank``. A row
    has ``{column}_bwd_gbops`` and, for a column with forward bits, ``{column}_fwd_gbops``
    (a layer HOT leaves exact runs its forward exactly too); the totals ``{column}_backward``
    and ``{column}_forward``."""
    columns = {c: (*v, None)[:3] for c, v in
               (columns if columns is not None else {m: (m, rank) for m in MODELS}).items()}
    for name, (model, _, _) in columns.items():
        if model not in MODELS:
            raise ValueError(f"column {name!r}: counting model {model!r} is not one of {MODELS}")
    rows = []
    tot = {"forward": 0.0, **{c: 0.0 for c in columns},
           **{f"{c}_forward": 0.0 for c, v in columns.items() if v[2]}}
    for s in shapes:
        row = {"layer": s.name, "L": s.L, "O": s.O, "I": s.I, "trainable": s.trainable,
               "forward_gbops": forward_counts(s).bops / 1e9}
        tot["forward"] += row["forward_gbops"]
        for c, (model, r, fbits) in columns.items():
            n = backward_counts(s, model, r, convention=convention, hot_applies=hot_applies(s))
            row[f"{c}_bwd_gbops"] = n.bops / 1e9
            tot[c] += n.bops / 1e9
            if fbits:
                f = forward_counts(s, fbits if hot_applies(s) else None)
                row[f"{c}_fwd_gbops"] = f.bops / 1e9
                tot[f"{c}_forward"] += f.bops / 1e9
        row["fp_bwd_flops"] = 2 * backward_counts(s, "fp").fp_ops
        if hot_applies(s):
            row["hot_overhead_flops"] = 2 * backward_counts(s, "hot", rank, convention=convention).fp_ops
        rows.append(row)
    return {"convention": convention, "rank": rank, "layers": rows,
            "total_gbops": {"forward": tot["forward"], **{f"{c}_backward": tot[c] for c in columns},
                            **{f"{c}_forward": tot[f"{c}_forward"] for c, v in columns.items()
                               if v[2]}}}
