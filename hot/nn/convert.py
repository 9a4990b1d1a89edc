"""convert / unconvert: swap nn.Linear and nn.Conv2d for their HOT versions.

Which modules convert, and the reasons others are left alone, are in ``hot.nn.selection``; what
a call did is logged (logger "hot"), kept for ``hot.summary(model)``, and warned about where a
user may not expect it: nothing converted, a layer the filter chose left alone by a default
(the output head, LoRA adapters), a subclass with its own forward or a lazy module.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from typing import Callable, Optional

import torch.nn as nn

from ..common.backend import requested_backend
from ..common.config import HOTConfig, HOTConfigError
from . import groups, hfsave
from .modules import (HOT_ATTRS, HOT_BUFFERS, HOT_STATE_KEYS, HOTConv2d, HOTLinear, _adopt,
                      hot_class, original_class)
from .selection import (ADAPTER, FILTERED, HEAD, UNSUPPORTED, filter_fn, linear_or_conv,
                        output_head, reason_left)
from .summary import RECORD, summary

log = logging.getLogger("hot")

# What a default exclusion says when the filter had chosen the layer: the argument that converts it.
_OVERRIDE = {HEAD: "convert_head=True", ADAPTER: "convert_adapters=True"}


def _replace(root: nn.Module, fqn: str, new: nn.Module) -> None:
    parent_name, _, child = fqn.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _shown(fqns) -> str:
    return ", ".join(repr(f) for f in fqns[:3]) + (", ..." if len(fqns) > 3 else "")


def _report(model: nn.Module, converted: Counter, reconfigured: int, chosen_but_left: dict) -> None:
    """The log lines, and one warning for what a user may not expect."""
    s = summary(model)
    made = ", ".join(f"{n} {k}" for k, n in sorted(converted.items())) or "no layer"
    log.info("hot.convert: converted %s%s", made,
             f"; {reconfigured} HOT layers given the new config" if reconfigured else "")
    surprising = []
    for why, fqns in sorted(s.left.items()):
        log.info("hot.convert: left %d as they are: %s (%s)", len(fqns), why, _shown(fqns))
        detail = why.partition(": ")[2]
        if why.startswith(UNSUPPORTED) and detail.startswith(("subclass", "lazy")):
            surprising.append(f"{len(fqns)} {detail}: {_shown(fqns)}")
    for why, fqns in sorted(chosen_but_left.items()):
        surprising.append(f"{len(fqns)} the filter chose but left as the {why} ({_shown(fqns)}; "
                          f"pass {_OVERRIDE[why]} to convert them)")
    if not converted and not reconfigured:
        why = "; ".join(f"{len(v)} {k}" for k, v in sorted(s.left.items())) or "it has none"
        surprising.insert(0, f"no layer of {type(model).__name__} was converted ({why}), so "
                             f"nothing runs HOT's backward; print(hot.summary(model)) lists them")
    if surprising:
        warnings.warn("hot.convert: " + "; ".join(surprising), stacklevel=3)


def _record(model: nn.Module, left: dict) -> None:
    """Keep each left-alone layer's reason for hot.summary; a later call's filter does not hide
    an earlier reason (a call that only re-configures a few layers filters all the others)."""
    if not left and RECORD not in model.__dict__:
        return
    rec = model.__dict__.setdefault(RECORD, {})
    for fqn, why in left.items():
        if why != FILTERED or fqn not in rec:
            rec[fqn] = why


def convert(
    model: nn.Module,
    config: Optional[HOTConfig] = None,
    *,
    module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    filter: Optional[Callable[[str, nn.Module], bool]] = None,
    convert_head: bool = False,
    convert_adapters: bool = False,
    backend: Optional[str] = None,
) -> nn.Module:
    """Make the nn.Linear and groups=1 nn.Conv2d layers of ``model`` HOT layers; returns the model.

    config: HOTConfig (default: HOTConfig(); HOTConfig.paper() is the paper's setting).
        Layers that are already HOT layers and
        pass the filter take this config (their step counters and LQS decisions are kept).
    module_filter_fn: ``module_filter_fn(module, fqn) -> bool`` (torchao's signature); only
        modules for which it returns True convert.
    filter: the older spelling, ``filter(fqn, module) -> bool`` (kept as an alias; a function
        whose parameters are named (module, fqn) is called so). Not both.
    convert_head: also convert the model's output head (hot.nn.selection.output_head), which is
        otherwise left exact.
    convert_adapters: also convert peft's lora_A / lora_B factors (otherwise only their frozen
        base_layer converts).
    backend: 'reference', 'fast' or 'auto'; default: HOT_BACKEND, else 'auto'. Checked now (an
        unknown name fails here); where 'fast' cannot run is checked at the first forward, on the
        input's device.
    Everything converts in place: a container's layers are replaced by HOT layers that share
    the original Parameter objects, and a bare layer becomes a HOT layer itself (its class
    changes), so the return value is always ``model``. ``hot.summary(model)`` lists what
    converted and what was left alone, by reason.
    """
    config = HOTConfig() if config is None else config
    if not isinstance(config, HOTConfig):
        raise TypeError(f"config must be a hot.HOTConfig, got {type(config).__name__}; "
                        f"build one with hot.HOTConfig(...) or HOTConfig.from_dict(...)")
    if filter is not None and module_filter_fn is not None:
        raise HOTConfigError("hot.convert: pass module_filter_fn or filter (its older spelling), "
                             "not both")
    keep = filter_fn(filter, module_filter_fn)
    requested_backend(backend)  # validates the name early
    parents = dict(model.named_modules())
    head = output_head(model)
    targets, reconfigured = [], 0
    left, chosen_but_left = {}, {}
    for fqn, mod in linear_or_conv(model):
        name = fqn or "<root>"
        if keep is not None and not keep(fqn, mod):
            if not isinstance(mod, (HOTLinear, HOTConv2d)):
                left[name] = FILTERED
            continue
        if isinstance(mod, (HOTLinear, HOTConv2d)):
            mod.set_hot_config(config)
            mod.hot_backend = backend
            mod._hot_resolved.clear()
            reconfigured += 1
            continue
        why = reason_left(fqn, mod, parents.get(fqn.rpartition(".")[0]) if fqn else None,
                          head, convert_head, convert_adapters)
        if why is None:
            targets.append((fqn, mod))
            continue
        left[name] = why
        if keep is not None and why in _OVERRIDE:
            chosen_but_left.setdefault(why, []).append(name)
    converted = Counter()
    for fqn, mod in targets:
        converted[type(mod).__name__] += 1
        if not fqn:  # the model is a bare layer: it becomes a HOT layer itself
            hot_class(type(mod)).convert_in_place(mod, config, fqn, backend)
        else:
            _replace(model, fqn, hot_class(type(mod)).from_module(mod, config, fqn, backend))
    _record(model, left)
    groups.assign(model)
    hfsave.refresh(model)
    _report(model, converted, reconfigured, chosen_but_left)
    return model


def _strip_hot(mod: nn.Module) -> None:
    """Remove what _hot_init added (HOT_BUFFERS, HOT_ATTRS) from ``mod``."""
    for k in HOT_BUFFERS:
        mod._buffers.pop(k, None)
        mod._non_persistent_buffers_set.discard(k)
    for k in HOT_ATTRS:
        mod.__dict__.pop(k, None)
    mod.__dict__.pop(RECORD, None)


def unconvert(model: nn.Module) -> nn.Module:
    """Restore each HOT layer's original class (same Parameters) in place, a bare HOT layer
    included (its class changes back); returns ``model``."""
    for fqn, mod in list(model.named_modules()):
        if not isinstance(mod, (HOTLinear, HOTConv2d)):
            continue
        if not fqn:
            mod.__class__ = original_class(type(mod))
            _strip_hot(mod)
            return mod
        plain = _adopt(original_class(type(mod)), mod)
        _strip_hot(plain)
        _replace(model, fqn, plain)
    model.__dict__.pop(RECORD, None)
    hfsave.refresh(model)
    return model


def set_config(model: nn.Module, config: HOTConfig) -> int:
    """Give every HOT layer of ``model`` a new config (e.g. to change bits mid-training).
    Step counters and LQS decisions are kept. Returns the number of layers changed."""
    if not isinstance(config, HOTConfig):
        raise TypeError(f"config must be a hot.HOTConfig, got {type(config).__name__}")
    layers = hot_layers(model)
    for _, mod in layers:
        mod.set_hot_config(config)
    return len(layers)


def hot_layers(model: nn.Module):
    """(fqn, layer) for every HOT layer of ``model``."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (HOTLinear, HOTConv2d))]


def plain_state_dict(model: nn.Module) -> dict:
    """``model.state_dict()`` without HOT's state (its buffers and, with HLAConfig(amax=
    "delayed"), its histories): what the unconverted model loads with strict=True (and what to
    hand to save_pretrained or a plain checkpoint). A HOT checkpoint for resuming keeps them:
    use model.state_dict() there."""
    names = {f"{fqn}.{b}" if fqn else b for fqn, _ in hot_layers(model) for b in HOT_STATE_KEYS}
    return {k: v for k, v in model.state_dict().items() if k not in names}
