"""Backend registry and selection (argument > HOT_BACKEND > 'auto').

A backend registers its implementations of the operations in ``hot.common.ops`` and itself here
(its name and why it cannot run on a device) when its package is imported; ``fast`` is imported
on first use. This module imports neither backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .options import BackendName, options

BACKEND_NAMES = tuple(b.value for b in BackendName)


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run here; the message says why and what to do."""


@dataclass(frozen=True)
class Backend:
    name: str
    # (device) -> None if usable, else the reason it is not.
    why_unavailable: Callable[[torch.device], Optional[str]]


_REGISTRY: dict[str, Backend] = {}
_LOADERS: dict[str, Callable[[], None]] = {}


def register_backend(backend: Backend) -> None:
    _REGISTRY[backend.name] = backend


def register_loader(name: str, loader: Callable[[], None]) -> None:
    """A function that imports the backend's package (which then calls register_backend)."""
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
    """The backend name asked for: the argument, else HOT_BACKEND (options), else 'auto'."""
    if name is None:
        return options().backend.value
    if not isinstance(name, str) or name.strip().lower() not in BACKEND_NAMES:
        raise BackendUnavailableError(
            f"backend={name!r} is not a backend: use one of {BACKEND_NAMES}.")
    return name.strip().lower()


def resolve_backend(name: Optional[str], device: torch.device, layer: str = "") -> str:
    """The concrete backend ('reference' or 'fast') to run on ``device``.

    'auto' picks fast where it is built and the device supports it, else reference.
    'fast' where it cannot run raises with the reason.
    """
    name = requested_backend(name)
    if name == BackendName.REFERENCE:
        return name
    try:
        why = get_backend(BackendName.FAST.value).why_unavailable(device)
    except BackendUnavailableError as e:
        why = str(e)
    if why is None:
        return BackendName.FAST.value
    if name == BackendName.FAST:
        where = f" for layer {layer!r}" if layer else ""
        raise BackendUnavailableError(
            f"backend 'fast' was requested{where} on {device}, but it cannot run: {why}. "
            f"Use backend='reference' (or HOT_BACKEND=reference), or 'auto' to fall back."
        )
    return BackendName.REFERENCE.value


def is_available(backend: str = "fast", device=None, return_reason: bool = False):
    """Whether ``backend`` can run on ``device`` (default: the current CUDA device where CUDA is
    available, else the CPU), as TransformerEngine's is_fp8_available: with return_reason=True,
    ``(available, reason)``, ``reason`` None where the backend runs as itself. 'reference' runs
    everywhere; 'auto' always runs, and where it would fall back to the reference its reason
    says so and why fast cannot run."""
    name = requested_backend(backend)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    device = torch.device(device)
    why = None
    if name != BackendName.REFERENCE:
        try:
            why = get_backend(BackendName.FAST.value).why_unavailable(device)
        except BackendUnavailableError as e:
            why = str(e)
    ok = why is None or name == BackendName.AUTO
    if name == BackendName.AUTO and why is not None:
        why = f"'auto' runs the reference backend on {device}: fast cannot run ({why})"
    return (ok, why) if return_reason else ok
