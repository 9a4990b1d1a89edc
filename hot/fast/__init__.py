"""The fast backend: real INT4/INT8 kernels (Triton + CUTLASS) for Ampere and Hopper GPUs.

Not built yet: this shell registers a backend that always reports why it cannot run, so that
``HOT_BACKEND=fast`` fails with a clear message and ``auto`` falls back to the reference.
"""

from __future__ import annotations

import torch

from ..common.backend import Backend, register_backend

NOT_BUILT = "the fast backend is not built yet in this version of hot"


def why_unavailable(device: torch.device):
    return NOT_BUILT


def _unavailable(*args, **kwargs):
    raise RuntimeError(NOT_BUILT)


register_backend(Backend("fast", _unavailable, _unavailable, _unavailable, why_unavailable))
