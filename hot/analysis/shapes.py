"""The (L, O, I) shape of every Linear / Conv2d GEMM in one forward, read with forward hooks.

L = rows of the GEMM: every token of every sample for a Linear (all leading dimensions
flattened), batch * H_out * W_out for a Conv2d; O = output channels; I = input features
(C_in / groups * kh * kw for a Conv2d), following the supplement's (L, O, I) notation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn as nn


@dataclass
class LayerShape:
    name: str
    kind: str  # 'linear' or 'conv'
    L: int
    O: int
    I: int
    groups: int = 1
    trainable: bool = True  # weight.requires_grad
    params: int = 0
    input_requires_grad: bool = True
    x_numel: int = 0  # elements of the layer's input (for a conv: C*H*W*batch, not L*I)
    source: Optional[int] = None  # which input it read: equal for layers that read one tensor

    def __post_init__(self):
        if not self.x_numel:
            self.x_numel = self.L * self.I

    def to_dict(self) -> dict:
        return asdict(self)


def layer_shapes(model: nn.Module, run) -> list[LayerShape]:
    """Call ``run(model)`` (one forward) and return the shapes of the Linear/Conv2d layers in
    the order they ran; a layer called twice appears twice. Runs with autograd on (the graph
    is discarded) so that ``input_requires_grad`` is known. Layers that read the same input
    tensor (a transformer's q, k and v projections) get the same ``source``."""
    out: list[LayerShape] = []
    handles = []
    sources: dict = {}
    # Every input stays alive until the end, so no freed address is taken by a later input; an
    # in-place change between two reads makes a new version, so a new input.
    held = []

    def source_of(x):
        held.append(x)
        key = (x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype, x._version)
        return sources.setdefault(key, len(sources))

    def hook_for(name):
        def hook(mod, args, y):
            x = args[0]
            trainable = mod.weight.requires_grad
            n_par = sum(p.numel() for p in mod.parameters(recurse=False))
            if isinstance(mod, nn.Conv2d):
                kk = mod.kernel_size[0] * mod.kernel_size[1]
                L = y.shape[0] * y.shape[2] * y.shape[3]
                out.append(LayerShape(name, "conv", L, mod.out_channels,
                                      mod.in_channels // mod.groups * kk, mod.groups, trainable,
                                      n_par, x.requires_grad, x.numel(), source_of(x)))
            else:
                L = x.numel() // x.shape[-1]
                out.append(LayerShape(name, "linear", L, mod.out_features, mod.in_features,
                                      1, trainable, n_par, x.requires_grad, x.numel(),
                                      source_of(x)))
        return hook

    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Linear, nn.Conv2d)):
            handles.append(mod.register_forward_hook(hook_for(name)))
    try:
        with torch.enable_grad():
            run(model)
    finally:
        for h in handles:
            h.remove()
    return out
