"""Training methods: how a model is prepared and under which autocast it runs.

Extensible: a baseline (e.g. LUQ, LBP-WHT from the baselines issue) registers a Method here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

import hot


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    autocast: Optional[torch.dtype] = None
    # prepare(model, hot_config, filter, backend) -> model; None = train the model as built
    prepare: Optional[Callable] = None

    def context(self, device: torch.device):
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast)


def _hot(model: nn.Module, config, filt, backend):
    # The paper's setting: every layer, the output head too (the library's default leaves it);
    # LoRA runs pass a filter that names the layers, adapters included where asked for.
    hot.convert(model, config, filter=filt, convert_head=True, convert_adapters=True,
                backend=backend)
    if not hot.hot_layers(model):
        raise ValueError("method 'hot': no nn.Linear / nn.Conv2d was converted (check the model "
                         "and the LoRA settings); nothing would use HOT.")
    return model


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


METHODS: dict[str, Method] = {}


def register(m: Method) -> None:
    METHODS[m.name] = m


register(Method("fp32", "exact FP32 training"))
register(Method("bf16", "exact training under bf16 autocast", autocast=torch.bfloat16))
register(Method("hot", "HOT backward on every Linear/Conv2d (LoRA: frozen base layers only)",
                prepare=_hot))
register(Method("hot-bf16", "HOT under bf16 autocast", autocast=torch.bfloat16, prepare=_hot))
register(Method("int4", "the paper's naive INT4 baseline (HOTConfig.int4()): 4-bit operands "
                "in both backward GEMMs, no transform, full rank", prepare=_hot))
register(Method("lbp-wht", "the LBP-WHT baseline (HOTConfig.lbp_wht()): g_y and x projected "
                "on 8 of 16 Walsh rows along the tokens on both paths, no quantization",
                prepare=_hot))
register(Method("luq", "the LUQ baseline (HOTConfig.luq()): as int4 with g_y on 4-bit "
                "logarithmic levels", prepare=_hot))
