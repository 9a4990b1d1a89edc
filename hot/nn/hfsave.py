"""HOT's buffers stay out of HuggingFace ``save_pretrained``, and in ``state_dict``.

``hot_step`` and ``hot_lqs`` are persistent buffers, and a layer with HLAConfig(amax="delayed")
adds its histories (``hot_hist_x``, ``hot_hist_gy``) to its state dict: a checkpoint to resume
HOT training (``torch.save(model.state_dict())``, ``hot train``'s checkpoints, DCP) must carry
them. A
``save_pretrained`` folder is for the architecture's own class, which has no such keys, so
``from_pretrained`` would print them as unexpected. transformers' models skip the names in their
instance attribute ``_keys_to_ignore_on_save`` (exact names, relative to that model) when they
save: convert adds the HOT layers' buffer names there, unconvert takes them out. Duck-typed:
nothing here imports transformers.
"""

from __future__ import annotations

import torch.nn as nn

from .modules import HOT_STATE_KEYS, HOTConv2d, HOTLinear

_ATTR = "_keys_to_ignore_on_save"


def _declares(mod: nn.Module) -> bool:
    # Declared by the class (transformers' PreTrainedModel), not reached through a wrapper's
    # __getattr__ (peft's PeftModel forwards unknown attributes to the model it wraps).
    return hasattr(mod, "save_pretrained") and any(_ATTR in vars(c) for c in type(mod).__mro__)


def _is_hot_key(key: str) -> bool:
    return key.rpartition(".")[2] in HOT_STATE_KEYS


def refresh(model: nn.Module) -> None:
    """Make every HF model inside ``model`` skip exactly the HOT buffers under it on save."""
    for prefix, mod in model.named_modules():
        if not _declares(mod):
            continue
        keys = {k for k in (getattr(mod, _ATTR, None) or ()) if not _is_hot_key(k)}
        keys |= {f"{fqn}.{b}" if fqn else b for fqn, m in mod.named_modules()
                 if isinstance(m, (HOTLinear, HOTConv2d)) for b in HOT_STATE_KEYS}
        setattr(mod, _ATTR, keys)
