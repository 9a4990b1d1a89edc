"""HLA's rank per layer in a run: --hla-full-rank and what metrics.json says of the ranks.

The methods themselves are recipes (hot.recipes).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch.nn as nn

import hot


def full_rank(model: nn.Module, patterns: tuple, config, backend) -> list[str]:
    """Give the HOT layers whose name contains one of ``patterns`` HLA rank 16: their g_W keeps
    every Walsh coefficient (no low-rank projection; the INT8 quantization stays). Returns the
    names of the layers changed; patterns that together name no HOT layer are an error."""
    if not patterns:
        return []
    names = [n for n, _ in hot.hot_layers(model)]
    chosen = [n for n in names if any(p in n for p in patterns)]
    if not chosen:
        # One list may serve several model families (attn for ViTs and Llama, attention for
        # BERT): only a list that names no layer at all is an error.
        given = ",".join(patterns)
        raise ValueError(f"--hla-full-rank {given!r} names no HOT layer; HOT layers are named "
                         f"like {names[0]!r}" if names else
                         f"--hla-full-rank {given!r}: the model has no HOT layer.")
    keep = set(chosen)
    wide = config.replace(hla=dataclasses.replace(config.hla, rank=16))
    hot.convert(model, wide, filter=lambda fqn, _: fqn in keep, backend=backend)
    return chosen


def rank_record(layers) -> dict:
    """What metrics.json says of HLA's ranks: each HOT layer's rank and rank_share's figure."""
    return {"hla_rank": {n: m.hot_config.hla.rank for n, m in layers},
            "hla_rank_share": rank_share(layers)}


def rank_share(layers) -> Optional[float]:
    """HLA's g_W saving on these layers as a share of the paper's (rank 8 everywhere): the sum of
    (1 - r / 16) * weight size over (1/2) * weight size, i.e. per token of g_W multiply-adds
    where every layer sees the same tokens (a transformer's linear layers)."""
    sizes = [(m.hot_config.hla.rank, m.weight.numel()) for _, m in layers
             if m.hot_config.method == "hot"]
    total = sum(n for _, n in sizes)
    return sum((1 - r / 16) * n for r, n in sizes) / (0.5 * total) if total else None

