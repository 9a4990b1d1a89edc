"""Backend registry and selection (argument > HOT_BACKEND > 'auto').

A backend implements the three operations declared in ``hot.common.ops``. ``reference`` and
``fast`` register themselves here when imported; this module imports neither.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

BACKEND_NAMES = ("reference", "fast", "auto")


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here; the message says why and what to do."""


@dataclass
class Backend:
    name: str
    hq_quantize: Callable
    hla_quantize: Callable
    int_gemm_nt: Callable
    # (device) -> None if usable, else the reason it is not.
    why_unavailable: Callable[[torch.device], Optional[str]]


_REGISTRY: dict[str, Backend] = {}
_LOADERS: dict[str, Callable[[], None]] = {}


def register_backend(backend: Backend) -> None:
    _REGISTRY[backend.name] = backend


def register_loader(name: str, loader: Callable[[], None]) -> None:
    """A function that imports the backend's module (which then calls register_backend)."""
    _LOADERS[name] = loader


def get_backend(name: str) -> Backend:
    if name not in _REGISTRY and name in _LOADERS:
        _LOADERS[name]()
    if name not in _REGISTRY:
        raise BackendUnavailableError(
            f"backend {name!r} is not registered; known: {sorted(set(_REGISTRY) | set(_LOADERS))}"
        )
    return _REGISTRY[name]


def requested_backend(name: Optional[str] = None) -> str:
    """The backend name asked for: the argument, else $HOT_BACKEND, else 'auto'."""
    src = "argument backend"
    if name is None:
        name = os.environ.get("HOT_BACKEND", "auto") or "auto"
        src = "environment variable HOT_BACKEND"
    name = name.strip().lower()
    if name not in BACKEND_NAMES:
        raise BackendUnavailableError(
            f"{src}={name!r} is not a backend: use one of {BACKEND_NAMES}."
        )
    return name


def resolve_backend(name: Optional[str], device: torch.device, layer: str = "") -> str:
    """The concrete backend ('reference' or 'fast') to run on ``device``.

    'auto' picks fast where it is built and the device supports it, else reference.
    'fast' where it cannot run raises with the reason.
    """
    name = requested_backend(name)
    if name == "reference":
        return name
    try:
        fast = get_backend("fast")
        why = fast.why_unavailable(device)
    except BackendUnavailableError as e:
        why = str(e)
    if why is None:
        return "fast"
    if name == "fast":
        where = f" for layer {layer!r}" if layer else ""
        raise BackendUnavailableError(
            f"backend 'fast' was requested{where} on {device}, but it cannot run: {why}. "
            f"Use backend='reference' (or HOT_BACKEND=reference), or 'auto' to fall back."
        )
    return "reference"
