"""Sibling groups of HLAConfig(share="siblings"): layers that may read one input share the seeds
of its ABC codes and drawn rows, so they form the same codes of it.

A HOT Linear layer's group is its parent module's HOT Linear children with the same in_features
(q, k, v and o of an attention block; gate and up of a gated MLP), in module order. Under
HLAConfig(share="siblings") a member's ABC codes and drawn HLA rows follow the seeds and step
counter of its source instead of its own (``abc_source``): the first member whose weight
trains, with its config and phase. So members that read one x form identical codes of it:
torch.compile (AOT autograd's common-subexpression elimination) then forms them once and keeps
one copy for backward. Members that read different inputs (o after attention) only draw the
same random numbers. Each layer's g_W stays unbiased, as long as the source's step counter
advances with the member's (``check_source``): a source whose backward stopped running would
repeat its seeds.
"""

from __future__ import annotations

import torch.nn as nn

GROUP = "_hot_abc_group"  # the member's group, in module order, in its __dict__


def assign(model: nn.Module) -> None:
    """Record every HOT Linear layer's group (hot.convert and set_config call it). A plain
    attribute (not submodules): deepcopy maps it to the copy's layers."""
    from .modules import HOTLinear

    for parent in model.modules():
        groups: dict = {}
        for child in parent.children():
            if isinstance(child, HOTLinear):
                groups.setdefault(child.in_features, []).append(child)
        for members in groups.values():
            for child in members:
                child.__dict__[GROUP] = tuple(members)


def abc_source(layer: nn.Module) -> nn.Module:
    """The layer whose seeds and step counter ``layer``'s ABC codes and drawn rows follow: under
    HLAConfig(share="siblings"), the first member of its group whose weight trains and that
    runs its config in its phase; else ``layer`` itself. A frozen member is never a source: a
    layer with no gradient to form may run no backward, so its step counter may stand still."""
    group = layer.__dict__.get(GROUP)
    if not group or layer._hot_run_config.hla.share != "siblings":
        return layer
    for m in group:
        if m is layer:
            return layer
        if m.weight.requires_grad and m._hot_config_key == layer._hot_config_key \
                and m._hot_exact_phase == layer._hot_exact_phase:
            return m
    return layer


def check_source(layer: nn.Module, src: nn.Module) -> None:
    """Raise if ``layer``'s source (abc_source) has run fewer backwards than ``layer``: its
    step counter stood still (its output got no gradient in some step), so its seeds, which
    ``layer``'s codes and drawn rows follow, would repeat, and a fixed selection is biased."""
    if src is not layer and src.hot_step_value() < layer.hot_step_value():
        raise RuntimeError(
            f"HOT layer {layer.hot_name!r} follows the seeds of {src.hot_name!r} "
            f"(HLAConfig(share='siblings')), whose backward ran {src.hot_step_value()} times "
            f"against its {layer.hot_step_value()}: {src.hot_name!r}'s output reached no loss "
            f"in some step, and its seeds would repeat. Use HLAConfig(share='none') for this "
            f"model, or freeze {src.hot_name!r} (requires_grad=False) if it does not train.")
