"""Measure the bytes autograd keeps for backward, per layer, with saved-tensor hooks.

Every tensor that autograd saves during a forward passes through the pack hook of
``torch.autograd.graph.saved_tensors_hooks``. We attribute it to the innermost nn.Linear /
nn.Conv2d whose forward is running (forward pre/post hooks keep a stack), or to '<other>'
(norms, activations, attention, losses). A storage is counted once however many tensors
(views, repeated saves) point into it, and at its full size; a storage saved both by a layer
and by another op is charged to the layer (the layer alone would keep it alive). Parameters are excluded: they
exist whether or not anything is saved; a cast copy of a weight (autocast) is not a Parameter
and is counted.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn as nn

OTHER = "<other>"


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr()), s.nbytes()


class SavedTensorMeter:
    """Context manager: ``with SavedTensorMeter(model) as m: loss = f(model(x))``; then
    ``m.by_layer`` = {layer fqn: bytes}, ``m.total`` = all bytes saved, ``m.layer_total`` =
    bytes attributed to Linear/Conv2d layers. Keep the graph alive (do not call backward)
    inside the block if you also want ``live_bytes`` to be the peak; counting is unaffected."""

    def __init__(self, model: nn.Module, layer_types=(nn.Linear, nn.Conv2d)):
        self.model = model
        self.layer_types = layer_types
        self.by_layer: "OrderedDict[str, int]" = OrderedDict()
        self.dtypes: dict[str, set] = {}
        self._owner: dict = {}  # storage key -> where it is charged
        self._stack: list[str] = []
        self._handles: list = []
        self._params = {_storage_key(p)[0] for p in model.parameters()}
        self._hooks_ctx = None

    def _pack(self, t: torch.Tensor):
        key, nbytes = _storage_key(t)
        if key in self._params:
            return t
        where = self._stack[-1] if self._stack else OTHER
        owner = self._owner.get(key)
        if owner is not None:
            if owner == OTHER and where != OTHER:
                # Also saved by a layer (e.g. attention's output is proj's input): the layer
                # needs it, so it is charged to the layer; it is still counted once.
                self.by_layer[OTHER] -= nbytes
                self.by_layer[where] = self.by_layer.get(where, 0) + nbytes
                self._owner[key] = where
            return t
        self._owner[key] = where
        self.by_layer[where] = self.by_layer.get(where, 0) + nbytes
        self.dtypes.setdefault(where, set()).add(str(t.dtype).replace("torch.", ""))
        return t

    def _enter_hook(self, name: str):
        def hook(module, args):
            self._stack.append(name)  # returns None: the input is left unchanged
        return hook

    def _exit_hook(self, module, args, output):
        self._stack.pop()

    def __enter__(self):
        for name, mod in self.model.named_modules():
            if isinstance(mod, self.layer_types):
                self.by_layer.setdefault(name, 0)
                self._handles.append(mod.register_forward_pre_hook(self._enter_hook(name)))
                self._handles.append(mod.register_forward_hook(self._exit_hook))
        self._hooks_ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks_ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks_ctx.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False

    @property
    def total(self) -> int:
        return sum(self.by_layer.values())

    @property
    def layer_total(self) -> int:
        return sum(v for k, v in self.by_layer.items() if k != OTHER)
