"""Which kernel family runs on a device: 'sm90' (Hopper), 'sm80' (Ampere/Ada), or a reason why none.

HOT_FAST_ARCH=sm80 forces the Ampere family on a Hopper GPU (its int4 tensor-op path is emulated
there, slow but exact), so the Ampere code can be tested on the only GPUs at hand.
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch

ARCHS = ("sm80", "sm90")


def env_flag(name: str) -> bool:
    """Whether the environment variable `name` is set to anything but "" or "0"."""
    return os.environ.get(name, "0") not in ("", "0")


# Read once, at import (Triton reads TRITON_INTERPRET when a kernel is decorated, which is also
# at import): the Triton interpreter runs the kernels on CPU (tests); HOT_FAST_AUTOTUNE=1 makes
# the quantizers and the Triton GEMM autotune their tiles instead of using one fixed tile.
INTERPRET = env_flag("TRITON_INTERPRET")
AUTOTUNE = env_flag("HOT_FAST_AUTOTUNE")

# Quantize-kernel variant of the g_y / W passes (hot.fast.quant._VARIANTS says what each is;
# hot/fast/quant_kernels_v4.py the methods). "dot" is the v2/v3 kernel of quant_kernels.py;
# the default "mix" (stats: K=16 dot + register butterflies, quantize: vector-load butterflies)
# measured 10-13% faster on ViT-B g_y passes and 21x on fp32 W^T views (H100, docs/kernels.md).
DEFAULT_QKERNEL = "mix"
QKERNELS = ("dot", "k16", "k16_bfly", "bfly", "bflyv", "bfly_split", "mix")


def _qkernel() -> str:
    v = os.environ.get("HOT_FAST_QKERNEL", "").strip().lower() or DEFAULT_QKERNEL
    if v not in QKERNELS:
        raise ValueError(f"HOT_FAST_QKERNEL={v!r} is not one of {QKERNELS}; unset it for the "
                         f"default {DEFAULT_QKERNEL!r} (benchmarks/quant_variants.py times them all).")
    return v


QKERNEL = _qkernel()


def _override() -> Optional[str]:
    v = os.environ.get("HOT_FAST_ARCH", "").strip().lower()
    if not v:
        return None
    if v not in ARCHS:
        raise ValueError(f"HOT_FAST_ARCH={v!r} is not one of {ARCHS}; unset it to detect the GPU.")
    return v


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


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
    major, minor = _capability(device.index if device.index is not None else torch.cuda.current_device())
    if major < 8:
        return (f"the GPU has compute capability {major}.{minor}; the fast kernels need sm_80 or "
                f"newer (Ampere, Ada, Hopper) for int8 tensor cores")
    return None


def arch_for(device: torch.device) -> str:
    """'sm90' on Hopper and newer unless HOT_FAST_ARCH=sm80; 'sm80' on Ampere/Ada; 'sm80' on CPU
    (interpreter), where only the portable Triton paths exist."""
    forced = _override()
    device = torch.device(device)
    if device.type != "cuda":
        return forced or "sm80"
    major, _ = _capability(device.index if device.index is not None else torch.cuda.current_device())
    native = "sm90" if major >= 9 else "sm80"
    if forced == "sm90" and native != "sm90":
        raise ValueError(f"HOT_FAST_ARCH=sm90 was set, but {device} is sm_{major}x; unset it.")
    return forced or native
