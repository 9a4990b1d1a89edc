"""Which kernel family runs on a device: 'sm90' (Hopper), 'sm80' (Ampere/Ada), or a reason why none.

HOT_FAST_ARCH=sm80 (options().fast_arch) forces the Ampere family on a Hopper GPU (its int4
tensor-op path is emulated there, slow but exact), so the Ampere code can be tested on the only
GPUs at hand.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from ..common.options import options


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def triton_available() -> Optional[str]:
    try:
        import triton  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return f"triton cannot be imported ({e}); install it with `pip install triton`"
    return None


def why_unavailable(device: torch.device) -> Optional[str]:
    """None when the fast kernels can run on ``device``, else the reason in plain words."""
    device = torch.device(device)
    if device.type != "cuda":
        return (f"the fast kernels run on CUDA GPUs, and the tensors are on {device} "
                f"(the Triton interpreter is used only by the tests)")
    why = triton_available()
    if why:
        return why
    if not torch.cuda.is_available():
        return "torch reports no usable CUDA device"
    major, minor = _capability(_index(device))
    if major < 8:
        return (f"the GPU has compute capability {major}.{minor}; the fast kernels need sm_80 or "
                f"newer (Ampere, Ada, Hopper) for int8 tensor cores")
    return None


def arch_for(device: torch.device) -> str:
    """'sm90' on Hopper and newer unless HOT_FAST_ARCH=sm80; 'sm80' on Ampere/Ada; 'sm80' on CPU
    (interpreter), where only the portable Triton paths exist."""
    forced = options().fast_arch
    forced = forced.value if forced is not None else None
    device = torch.device(device)
    if device.type != "cuda":
        return forced or "sm80"
    major, _ = _capability(_index(device))
    native = "sm90" if major >= 9 else "sm80"
    if forced == "sm90" and native != "sm90":
        raise ValueError(f"HOT_FAST_ARCH=sm90 was set, but {device} is sm_{major}x; unset it.")
    return forced or native
