"""Run-time options: the one place that reads ``HOT_*`` environment variables.

Every other module takes its settings from ``options()``; nothing else reads the environment.
Tests and benchmarks change an option with ``override(...)``, which also clears what was cached
from the old value (kernels compiled for a tile, pass plans).

=====================  =========================  =============================================
variable               field                      meaning
=====================  =========================  =============================================
HOT_BACKEND            backend                    'auto' (default), 'reference' or 'fast'
HOT_FAST_ARCH          fast_arch                  force the 'sm80' kernel family on a Hopper GPU
HOT_FAST_TILE          tile                       quantizer tile 'rows,cols,warps' (default 64,64,4)
HOT_FAST_AUTOTUNE      autotune                   1: autotune quantizer and Triton GEMM tiles
HOT_FAST_NATIVE        native                     0: launch the quantizers from Python, not C++
HOT_JIT_BUILD          jit_build                  1: compile csrc/ on first use if not installed
HOT_JIT_CACHE          jit_cache                  where a JIT build goes (~/.cache/hot/jit)
HOT_EXT_SO             ext_so                     load the extension from this file
HOT_NO_PROGRESS        progress                   1: no progress bars in the ``hot`` command
HOT_DEBUG              debug                      1: the ``hot`` command prints tracebacks
=====================  =========================  =============================================

Build-time variables (read by setup.py and csrc/build_config.py, not at run time):
HOT_BUILD_EXT, HOT_PTXAS_VERBOSE, TORCH_CUDA_ARCH_LIST, CUDA_HOME. ``TRITON_INTERPRET`` is
Triton's own switch (the kernels then run on the CPU, for tests); it is read here as ``interpret``
because Triton reads it once, when the kernels are defined.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Optional


class OptionsError(ValueError):
    """An environment variable or option has a value hot cannot use; the message says which."""


class BackendName(str, enum.Enum):
    AUTO = "auto"
    REFERENCE = "reference"
    FAST = "fast"


class Arch(str, enum.Enum):
    """The fast backend's kernel family: Ampere/Ada mma.sync ('sm80') or Hopper wgmma ('sm90')."""

    SM80 = "sm80"
    SM90 = "sm90"


@dataclass(frozen=True)
class Tile:
    """One quantizer program's tile: rows x cols of the input (multiples of 16) and its warps."""

    rows: int = 64
    cols: int = 64
    warps: int = 4

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v % 16:
                raise OptionsError(f"Tile.{name}={v!r} must be a positive multiple of 16.")
        if self.warps not in (1, 2, 4, 8, 16):
            raise OptionsError(f"Tile.warps={self.warps!r} must be 1, 2, 4, 8 or 16.")


@dataclass(frozen=True)
class Options:
    backend: BackendName = BackendName.AUTO
    fast_arch: Optional[Arch] = None
    tile: Tile = Tile()
    autotune: bool = False
    native: bool = True
    jit_build: bool = False
    jit_cache: Optional[str] = None
    ext_so: Optional[str] = None
    progress: bool = True
    debug: bool = False
    interpret: bool = False


def _flag(env, name: str, default: bool) -> bool:
    v = env.get(name, "").strip()
    if not v:
        return default
    if v in ("0", "1"):
        return v == "1"
    raise OptionsError(f"{name}={v!r} must be 0 or 1 (or unset for the default).")


def _choice(env, name: str, enum_cls, default):
    v = env.get(name, "").strip().lower()
    if not v:
        return default
    try:
        return enum_cls(v)
    except ValueError:
        raise OptionsError(f"{name}={v!r} is not one of {[e.value for e in enum_cls]}; "
                           f"unset it for the default.") from None


def _tile(env) -> Tile:
    v = env.get("HOT_FAST_TILE", "").strip()
    if not v:
        return Tile()
    try:
        rows, cols, warps = (int(p) for p in v.split(","))
    except ValueError:
        raise OptionsError(f"HOT_FAST_TILE={v!r} must be 'rows,cols,warps', e.g. '64,64,4'.") \
            from None
    return Tile(rows, cols, warps)


def from_env(env=None) -> Options:
    """The options the environment ``env`` (default: os.environ) sets."""
    env = os.environ if env is None else env
    return Options(
        backend=_choice(env, "HOT_BACKEND", BackendName, BackendName.AUTO),
        fast_arch=_choice(env, "HOT_FAST_ARCH", Arch, None),
        tile=_tile(env),
        autotune=_flag(env, "HOT_FAST_AUTOTUNE", False),
        native=_flag(env, "HOT_FAST_NATIVE", True),
        jit_build=_flag(env, "HOT_JIT_BUILD", False),
        jit_cache=env.get("HOT_JIT_CACHE") or None,
        ext_so=env.get("HOT_EXT_SO") or None,
        progress=not _flag(env, "HOT_NO_PROGRESS", False),
        debug=_flag(env, "HOT_DEBUG", False),
        interpret=_flag(env, "TRITON_INTERPRET", False),
    )


_CURRENT: list = []
_ON_CHANGE: list = []


def options() -> Options:
    """The options in force: read from the environment on first use, or set by ``override``."""
    if not _CURRENT:
        _CURRENT.append(from_env())
    return _CURRENT[-1]


def on_change(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to run whenever ``override`` changes the options (cache invalidation)."""
    _ON_CHANGE.append(fn)
    return fn


def _notify() -> None:
    for fn in _ON_CHANGE:
        fn()


@contextlib.contextmanager
def override(**changes) -> Iterator[Options]:
    """Inside this block ``options()`` has ``changes`` applied (fields of Options by name)."""
    new = dataclasses.replace(options(), **changes)
    _CURRENT.append(new)
    _notify()
    try:
        yield new
    finally:
        _CURRENT.pop()
        _notify()
