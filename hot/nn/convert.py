"""convert / unconvert: swap nn.Linear and nn.Conv2d for their HOT versions in place."""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch.nn as nn

from ..common.backend import requested_backend
from ..common.config import HOTConfig
from .modules import HOT_ATTRS, HOT_BUFFERS, HOTConv2d, HOTLinear, _adopt, conv_supported

FilterFn = Callable[[str, nn.Module], bool]


def _replace(root: nn.Module, fqn: str, new: nn.Module) -> None:
    parent_name, _, child = fqn.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)


def convert(
    model: nn.Module,
    config: Optional[HOTConfig] = None,
    *,
    filter: Optional[FilterFn] = None,
    backend: Optional[str] = None,
) -> nn.Module:
    """Replace every nn.Linear and groups=1 nn.Conv2d of ``model`` (in place) with HOT layers.

    config: HOTConfig (default: the paper's setting).
    filter: ``filter(fqn, module) -> bool``; only modules for which it returns True are converted.
    backend: 'reference', 'fast' or 'auto'; default: $HOT_BACKEND, else 'auto'. Checked now (an
        unknown name fails here); where 'fast' cannot run is checked at the first forward, on the
        input's device.
    The new layers share the original Parameter objects. Returns ``model``.
    """
    config = config or HOTConfig()
    if not isinstance(config, HOTConfig):
        raise TypeError(f"config must be a hot.HOTConfig, got {type(config).__name__}")
    requested_backend(backend)  # validates the name early
    if isinstance(model, (HOTLinear, HOTConv2d)):
        return model
    targets = []
    for fqn, mod in model.named_modules():
        if isinstance(mod, (HOTLinear, HOTConv2d)) or not fqn:
            continue
        if isinstance(mod, nn.Linear) and not _is_wrapper(mod):
            kind = "linear"
        elif isinstance(mod, nn.Conv2d):
            why = conv_supported(mod)
            if why is not None:
                if filter is None or filter(fqn, mod):
                    warnings.warn(f"hot.convert: {fqn!r} stays a standard Conv2d: {why}")
                continue
            kind = "conv"
        else:
            continue
        if filter is not None and not filter(fqn, mod):
            continue
        targets.append((fqn, mod, kind))
    for fqn, mod, kind in targets:
        if kind == "linear":
            new = HOTLinear.from_linear(mod, config, fqn, backend)
        else:
            new = HOTConv2d.from_conv(mod, config, fqn, backend)
        _replace(model, fqn, new)
    return model


def _is_wrapper(mod: nn.Module) -> bool:
    # Subclasses that hold their own submodules (e.g. peft's lora.Linear wraps a base_layer)
    # are containers, not layers: convert their children instead.
    return len(mod._modules) > 0


def unconvert(model: nn.Module) -> nn.Module:
    """Restore plain nn.Linear / nn.Conv2d modules (same Parameters) in place; returns ``model``."""
    for fqn, mod in list(model.named_modules()):
        if isinstance(mod, HOTLinear):
            plain = _adopt(nn.Linear, mod)
        elif isinstance(mod, HOTConv2d):
            plain = _adopt(nn.Conv2d, mod)
        else:
            continue
        for k in HOT_BUFFERS:
            plain._buffers.pop(k, None)
            plain._non_persistent_buffers_set.discard(k)
        for k in HOT_ATTRS:
            plain.__dict__.pop(k, None)
        if not fqn:
            return plain
        _replace(model, fqn, plain)
    return model


def set_config(model: nn.Module, config: HOTConfig) -> int:
    """Give every HOT layer of ``model`` a new config (e.g. to change bits mid-training).
    Step counters and LQS decisions are kept. Returns the number of layers changed."""
    layers = hot_layers(model)
    for _, mod in layers:
        mod.set_hot_config(config)
    return len(layers)


def hot_layers(model: nn.Module):
    """(fqn, layer) for every HOT layer of ``model``."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (HOTLinear, HOTConv2d))]
