"""Sibling groups of HLAConfig(share="siblings"): layers that may read one input share the seeds
of its ABC codes and drawn rows, so they form the same codes of it.

A HOT Linear layer's group is its parent module's HOT Linear children with the same in_features
(q, k, v and o of an attention block; gate and up of a gated MLP); its first (module order) is
the group's source. Under HLAConfig(share="siblings") a member's ABC codes and drawn HLA rows
follow the source's seeds and step counter instead of its own (``abc_source``), so members
that read one x form identical codes of it: torch.compile (AOT autograd's common-subexpression
elimination) then forms them once and keeps one copy for backward. Members that read different
inputs (o after attention) only draw the same random numbers. Each layer's g_W stays unbiased.
"""

from __future__ import annotations

import torch.nn as nn

SOURCE = "_hot_abc_source"  # the group's first layer, in the member's __dict__ (None: itself)


def assign(model: nn.Module) -> None:
    """Record every HOT Linear layer's group source (hot.convert and set_config call it). The
    reference is a plain attribute (not a submodule): deepcopy maps it to the copy's source."""
    from .modules import HOTLinear

    for parent in model.modules():
        first: dict = {}
        for child in parent.children():
            if isinstance(child, HOTLinear):
                src = first.setdefault(child.in_features, child)
                child.__dict__[SOURCE] = None if src is child else src


def abc_source(layer: nn.Module) -> nn.Module:
    """The layer whose seeds and step counter ``layer``'s ABC codes and drawn rows follow: its
    group's source under HLAConfig(share="siblings") while both run one config in one phase,
    else ``layer`` itself."""
    src = getattr(layer, SOURCE, None)
    if src is None or layer._hot_run_config.hla.share != "siblings":
        return layer
    if src._hot_config_key != layer._hot_config_key or \
            src._hot_exact_phase != layer._hot_exact_phase:
        return layer
    return src
