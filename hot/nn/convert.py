"""convert / unconvert: swap nn.Linear and nn.Conv2d for their HOT versions.

Which modules convert: nn.Linear and groups=1 nn.Conv2d, and their subclasses that compute the
parent's forward (nn.modules.linear.NonDynamicallyQuantizableLinear, a subclass that only adds
attributes or methods). A subclass with a forward of its own (timm's StdConv2d and Conv2dSame,
which standardize weights or pad asymmetrically) stays as it is: HOT would replace that forward.
Also left alone: lazy modules whose parameters are not materialized yet, the projections inside
nn.MultiheadAttention (it reads their weights directly and never calls them), and grouped or
depthwise convolutions. What was converted and what was skipped, and why, is logged (logger
"hot", one line per kind); skips a user may not expect (a subclass with its own forward, lazy
modules) are also summarized in one warning.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections import Counter, defaultdict
from typing import Callable, Optional

import torch.nn as nn
from torch.nn.modules.lazy import LazyModuleMixin

from ..common.backend import requested_backend
from ..common.config import HOTConfig, HOTConfigError
from .modules import (HOT_ATTRS, HOT_BUFFERS, HOTConv2d, HOTLinear, _adopt, conv_supported,
                      hot_class, original_class)

FilterFn = Callable[[str, nn.Module], bool]
log = logging.getLogger("hot")

_TORCHAO_ORDER = ({"mod", "module", "m"}, {"fqn", "name", "path"})


def _keeps_parent_forward(mod: nn.Module, base: type) -> bool:
    cls = type(mod)
    if cls.forward is not base.forward:
        return False
    return base is not nn.Conv2d or cls._conv_forward is nn.Conv2d._conv_forward


def _why_not(mod: nn.Module, parent: Optional[nn.Module]) -> Optional[str]:
    """None if ``mod`` converts, else the reason it stays (its kind of skip)."""
    if isinstance(mod, LazyModuleMixin) and mod.has_uninitialized_params():
        return "lazy, parameters not materialized (run one forward, then convert)"
    if isinstance(parent, nn.MultiheadAttention):
        return "projection inside nn.MultiheadAttention (it reads the weight directly)"
    base = nn.Linear if isinstance(mod, nn.Linear) else nn.Conv2d
    if not _keeps_parent_forward(mod, base):
        return f"subclass {type(mod).__name__} with its own forward (HOT would replace it)"
    if base is nn.Conv2d:
        return conv_supported(mod)
    return None


def _filter_fn(filter: Optional[FilterFn]) -> Optional[FilterFn]:
    """``filter`` called as filter(fqn, module); a function whose parameters are named in
    torchao's order (module, fqn) is called that way round."""
    if filter is None:
        return None
    try:
        names = [p.name for p in inspect.signature(filter).parameters.values()][:2]
    except (TypeError, ValueError):
        names = []
    if len(names) == 2 and (names[0] in _TORCHAO_ORDER[0] or names[1] in _TORCHAO_ORDER[1]):
        return lambda fqn, mod: filter(mod, fqn)
    return filter


def _replace(root: nn.Module, fqn: str, new: nn.Module) -> None:
    parent_name, _, child = fqn.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def _log_report(converted: Counter, reconfigured: int, skipped: dict) -> None:
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(converted.items())) or "no layer"
    log.info("hot.convert: converted %s%s", kinds,
             f"; {reconfigured} HOT layers given the new config" if reconfigured else "")
    surprising = []
    for why, fqns in sorted(skipped.items()):
        shown = ", ".join(repr(f) for f in fqns[:3]) + (", ..." if len(fqns) > 3 else "")
        log.info("hot.convert: left %d as they are: %s (%s)", len(fqns), why, shown)
        if why.startswith(("subclass", "lazy")):
            surprising.append(f"{len(fqns)} {why}: {shown}")
    if surprising:
        warnings.warn("hot.convert left these layers unconverted: " + "; ".join(surprising),
                      stacklevel=3)


def convert(
    model: nn.Module,
    config: Optional[HOTConfig] = None,
    *,
    filter: Optional[FilterFn] = None,
    module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
    backend: Optional[str] = None,
) -> nn.Module:
    """Make every nn.Linear and groups=1 nn.Conv2d of ``model`` a HOT layer (module docstring
    says which subclasses and which layers are left alone); returns the model.

    config: HOTConfig (default: the paper's setting). Layers that are already HOT layers and
        pass the filter take this config (their step counters and LQS decisions are kept).
    filter: ``filter(fqn, module) -> bool``; only modules for which it returns True convert.
        A function whose parameters are named (module, fqn), torchao's order, is called so.
    module_filter_fn: the same in torchao's order, ``module_filter_fn(module, fqn)``.
    backend: 'reference', 'fast' or 'auto'; default: HOT_BACKEND, else 'auto'. Checked now (an
        unknown name fails here); where 'fast' cannot run is checked at the first forward, on the
        input's device.
    Everything converts in place: a container's layers are replaced by HOT layers that share
    the original Parameter objects, and a bare layer becomes a HOT layer itself (its class
    changes), so the return value is always ``model``.
    """
    config = HOTConfig() if config is None else config
    if not isinstance(config, HOTConfig):
        raise TypeError(f"config must be a hot.HOTConfig, got {type(config).__name__}; "
                        f"build one with hot.HOTConfig(...) or HOTConfig.from_dict(...)")
    if filter is not None and module_filter_fn is not None:
        raise HOTConfigError("pass filter or module_filter_fn, not both")
    keep = _filter_fn(filter) or (
        (lambda fqn, mod: module_filter_fn(mod, fqn)) if module_filter_fn is not None else None)
    requested_backend(backend)  # validates the name early
    parents = {fqn: m for fqn, m in model.named_modules()}
    targets, reconfigured = [], 0
    converted, skipped = Counter(), defaultdict(list)
    for fqn, mod in model.named_modules():
        if not isinstance(mod, (nn.Linear, nn.Conv2d)) or (keep is not None and not keep(fqn, mod)):
            continue
        if isinstance(mod, (HOTLinear, HOTConv2d)):
            mod.set_hot_config(config)
            mod.hot_backend = backend
            mod._hot_resolved.clear()
            reconfigured += 1
            continue
        if isinstance(mod, nn.Linear) and len(mod._modules) > 0:
            continue  # a container (peft's lora.Linear wraps a base_layer): its children convert
        why = _why_not(mod, parents.get(fqn.rpartition(".")[0]) if fqn else None)
        if why is not None:
            skipped[why].append(fqn or "<root>")
            continue
        targets.append((fqn, mod))
    for fqn, mod in targets:
        converted[type(mod).__name__] += 1
        if not fqn:  # the model is a bare layer: it becomes a HOT layer itself
            hot_class(type(mod)).convert_in_place(mod, config, fqn, backend)
        else:
            _replace(model, fqn, hot_class(type(mod)).from_module(mod, config, fqn, backend))
    _log_report(converted, reconfigured, skipped)
    return model


def _strip_hot(mod: nn.Module) -> None:
    """Remove what _hot_init added (HOT_BUFFERS, HOT_ATTRS) from ``mod``."""
    for k in HOT_BUFFERS:
        mod._buffers.pop(k, None)
        mod._non_persistent_buffers_set.discard(k)
    for k in HOT_ATTRS:
        mod.__dict__.pop(k, None)


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
    """``model.state_dict()`` without HOT's buffers: what the unconverted model loads with
    strict=True (and what to hand to save_pretrained or a plain checkpoint). A HOT checkpoint
    for resuming keeps them: use model.state_dict() there."""
    names = {f"{fqn}.{b}" if fqn else b for fqn, _ in hot_layers(model) for b in HOT_BUFFERS}
    return {k: v for k, v in model.state_dict().items() if k not in names}
