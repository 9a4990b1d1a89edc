"""Which modules ``hot.convert`` converts, and why each other Linear / Conv2d stays as it is.

Left alone, by reason (the names of ``ConvertSummary.left``):

* ``filtered``: the filter (``module_filter_fn`` / ``filter``) returned False.
* ``output head``: the model's output layer (``output_head``), unless ``convert_head=True``:
  torchao, bitsandbytes and peft leave it in full precision too.
* ``LoRA adapter``: peft's ``lora_A`` / ``lora_B`` factors, unless ``convert_adapters=True``
  (HOT's setting for LoRA is the frozen ``base_layer``; the paper's Table 3).
* ``unsupported: ...``: modules HOT cannot stand in for (a subclass with its own forward, lazy
  modules, projections inside nn.MultiheadAttention, grouped convolutions and other padding).
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch.nn as nn
from torch.nn.modules.lazy import LazyModuleMixin

from .modules import conv_supported

FILTERED, HEAD, ADAPTER, UNSUPPORTED = "filtered", "output head", "LoRA adapter", "unsupported"

# Names of output layers: timm (head, fc, classifier, last_linear), HF (lm_head, classifier,
# score, qa_outputs), torchvision (fc, classifier). "output" (torchtune's Llama) counts only as
# the layer's own name: HF BERT calls blocks' parts "...output.dense".
HEAD_NAMES = frozenset({"head", "lm_head", "classifier", "fc", "score", "last_linear",
                        "qa_outputs"})
HEAD_LEAF_NAMES = frozenset({"output"})
ADAPTER_NAMES = frozenset({"lora_A", "lora_B"})

_TORCHAO_ORDER = ({"mod", "module", "m"}, {"fqn", "name", "path"})


def is_container(mod: nn.Module) -> bool:
    """A Linear that wraps others (peft's lora.Linear around its base_layer): its children
    convert, not it."""
    return isinstance(mod, nn.Linear) and len(mod._modules) > 0


def linear_or_conv(model: nn.Module):
    """(fqn, module) for every nn.Linear / nn.Conv2d of ``model`` that is not a container."""
    return [(f, m) for f, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d)) and not is_container(m)]


def output_head(model: nn.Module) -> Optional[str]:
    """The prefix of the model's output head, or None. The rule: the last nn.Linear registered in
    ``model`` is the head when one part of its name is a head name (HEAD_NAMES, or "output" as
    its own name); the head is that part's module, so every Linear under it belongs to it
    (RoBERTa's classifier.dense and .out_proj, peft's classifier.modules_to_save.default and
    .original_module). A model whose last Linear has no such name (nn.Sequential) has none."""
    linears = [f for f, m in linear_or_conv(model) if isinstance(m, nn.Linear)]
    if not linears or not linears[-1]:
        return None
    parts = linears[-1].split(".")
    for i, p in enumerate(parts):
        if p in HEAD_NAMES:
            return ".".join(parts[:i + 1])
    return linears[-1] if parts[-1] in HEAD_LEAF_NAMES else None


def in_head(fqn: str, head: Optional[str]) -> bool:
    return head is not None and (fqn == head or fqn.startswith(head + "."))


def is_adapter(fqn: str) -> bool:
    return any(p in ADAPTER_NAMES for p in fqn.split("."))


def _keeps_parent_forward(mod: nn.Module, base: type) -> bool:
    cls = type(mod)
    if cls.forward is not base.forward:
        return False
    return base is not nn.Conv2d or cls._conv_forward is nn.Conv2d._conv_forward


def unsupported(mod: nn.Module, parent: Optional[nn.Module]) -> Optional[str]:
    """None if HOT can replace ``mod``, else why not."""
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


FilterFn = Callable[[str, nn.Module], bool]


def filter_fn(filter: Optional[Callable], module_filter_fn: Optional[Callable]) -> Optional[FilterFn]:
    """One ``keep(fqn, module)`` from convert's two spellings: ``module_filter_fn(module, fqn)``
    (torchao's), or the older ``filter(fqn, module)``, which a function whose parameters are
    named in torchao's order (module, fqn) is called as."""
    if module_filter_fn is not None:
        return lambda fqn, mod: module_filter_fn(mod, fqn)
    if filter is None:
        return None
    try:
        names = [p.name for p in inspect.signature(filter).parameters.values()][:2]
    except (TypeError, ValueError):
        names = []
    if len(names) == 2 and (names[0] in _TORCHAO_ORDER[0] or names[1] in _TORCHAO_ORDER[1]):
        return lambda fqn, mod: filter(mod, fqn)
    return filter


def reason_left(fqn: str, mod: nn.Module, parent: Optional[nn.Module], head: Optional[str],
                convert_head: bool, convert_adapters: bool) -> Optional[str]:
    """Why convert leaves ``mod`` (past the filter) as it is, or None if it converts."""
    why = unsupported(mod, parent)
    if why is not None:
        return f"{UNSUPPORTED}: {why}"
    if not convert_head and in_head(fqn, head):
        return HEAD
    if not convert_adapters and is_adapter(fqn):
        return ADAPTER
    return None
