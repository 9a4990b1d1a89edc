"""Helpers shared by the tests of hot.nn: building converted copies, float64 error bounds,
dense block projectors."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn

import hot
from hot.common.walsh import hla_matrix

U64 = 2.0**-53  # unit roundoff of float64


def gamma(n: int) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound on a float64 sum of n products."""
    return n * U64 / (1 - n * U64)


def pad16(n: int) -> int:
    return -(-n // 16) * 16


def ones_blocks(n: int) -> torch.Tensor:
    """|I (x) H16| |I (x) H16|^T cropped to n x n: blocks of 16 x 16 ones (16 * (1/4)^2 = 1).
    The same matrix bounds |I (x) T16|^T |I (x) T16| for the HLA transform at rank 16."""
    return torch.block_diag(*[torch.ones(16, 16, dtype=torch.float64)] * (pad16(n) // 16))[:n, :n]


def projector(length: int, rank: int, selection: str = "lowpass") -> torch.Tensor:
    """P = (I (x) T_r)^T (I (x) T_r) on the zero-padded token axis, cropped to length x length:
    the HLA g_W equals g_y^T P x when quantization is off."""
    t = hla_matrix(rank, selection)
    p = torch.block_diag(*[t.T @ t] * (pad16(length) // 16))
    return p[:length, :length]


def hot_copy(module: nn.Module, config: hot.HOTConfig, **kw) -> nn.Module:
    """A deep copy of ``module`` converted to HOT on the reference backend."""
    return hot.convert(copy.deepcopy(module), config, backend="reference", **kw)


def wrap(layer: nn.Module) -> nn.Module:
    """convert() replaces children, so a bare layer goes into a Sequential."""
    return nn.Sequential(layer)


def grads(model: nn.Module, x: torch.Tensor, gy: torch.Tensor):
    """(g_x, {name: grad}) after one backward of ``model(x)`` against ``gy``."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    model.zero_grad(set_to_none=True)
    y = model(x)
    y.backward(gy)
    return x.grad, {n: (p.grad.clone() if p.grad is not None else None)
                    for n, p in model.named_parameters()}


def step_grads(model: nn.Module, fwd, xs) -> list[dict]:
    """Parameter gradients of one backward of fwd(x).square().sum() per input in ``xs`` (no
    optimizer: the same weights each step; ``fwd``: the model or a compiled model)."""
    out = []
    for x in xs:
        model.zero_grad(set_to_none=True)
        fwd(x).square().sum().backward()
        out.append({k: p.grad.clone() for k, p in model.named_parameters()})
    return out


def saved_by_forward(model: nn.Module, x: torch.Tensor):
    """(output, tensors autograd saved during ``model(x)`` that are not (views of) the model's
    Parameters, Parameters/views that were saved), via saved_tensors_hooks."""
    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    params = [t for t in packed if t.untyped_storage().data_ptr() in ptrs]
    others = [t for t in packed if t.untyped_storage().data_ptr() not in ptrs]
    return y, others, params


def is_abc_seed(t: torch.Tensor) -> bool:
    """The seed a layer that forms its ABC codes in backward keeps (hot.nn.autograd): one int64
    on the CPU, 8 bytes."""
    return t.device.type == "cpu" and t.dtype == torch.int64 and t.numel() == 1


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
