"""Launch compiled Triton kernels without the JIT front end's per-call work.

``kernel[grid](*args, **meta)`` binds every argument, computes Triton's specialization key (type,
16-divisibility and ==1 of each int, 16-byte alignment of each pointer), hashes it with the
options and looks the compiled kernel up; from Python that costs tens of microseconds per launch,
which for HOT's small per-layer kernels is more than the kernels themselves (docs/performance.md).

``Direct(kernel)`` keeps the compiled kernels in a dict keyed by a cheaper key: the runtime
arguments' specialization properties plus the constexprs' key, computed once (``Meta``). The key
is at least as fine as Triton's, so a cached kernel is only reused for arguments Triton would
have compiled the same way. A hit is launched through the compiled kernel's own launcher. A miss goes through
``kernel[grid]`` (which compiles and launches) and caches what it returns. Under the Triton
interpreter, or while a launch hook is installed (profilers), every call takes the normal path.
"""

from __future__ import annotations

import torch

from ..common.options import options

_I32 = (-(1 << 31), 1 << 31)


def spec(v):
    """A hashable summary of one runtime argument that determines Triton's specialization of it."""
    t = type(v)
    if t is int:
        return (v == 1, v % 16 == 0, _I32[0] <= v < _I32[1], v >= 1 << 63)
    if t is bool or t is float or v is None:
        return (t, v)
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0, v.device.index)
    return v


class Meta:
    """The compile-time part of a launch (constexprs and options such as num_warps), with its
    hashable key computed once."""

    __slots__ = ("kw", "key")

    def __init__(self, **kw):
        self.kw = kw
        self.key = tuple(sorted(kw.items(), key=lambda kv: kv[0]))


class Direct:
    """``Direct(jit_fn)(grid, args, Meta(**meta))`` == ``jit_fn[grid](*args, **meta)``.

    ``args`` are the kernel's runtime parameters in signature order; every later parameter (the
    constexprs) comes from ``meta`` by name."""

    def __init__(self, fn):
        self.fn = fn
        self.names = list(fn.arg_names)
        self.cache: dict = {}
        self.tails: dict = {}

    def __call__(self, grid, args: tuple, meta: Meta, key=None):
        """Launches; returns the compiled kernel it ran (None under the interpreter or a hook).

        ``key``: the caller's own cache key, or None for (meta.key, spec of every argument).
        A caller that passes one guarantees it is at least as fine: equal keys must mean equal
        constexprs and equal spec of every argument (hot.fast.quantize's Python launch keys on
        its pass plan, which fixes the shape arguments, plus spec of the arguments that vary)."""
        if options().interpret or _hooks():
            self.fn[grid](*args, **meta.kw)
            return None
        if key is None:
            key = (meta.key, tuple(map(spec, args)))
        k = self.cache.get(key)
        if k is None:
            # Triton compiles (or finds) the kernel for exactly these arguments and launches it.
            k = self.cache[key] = self.fn[grid](*args, **meta.kw)
            return k
        tail = self.tails.get(meta.key)
        if tail is None:
            tail = self.tails[meta.key] = tuple(meta.kw[n] for n in self.names[len(args):])
        dev = args[0].device.index
        stream = torch._C._cuda_getCurrentRawStream(dev)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        k.run(grid[0], g1, g2, stream, k.function, k.packed_metadata, None, None, None, *args, *tail)
        return k


_KNOBS = []


def _hooks() -> bool:
    """Whether a launch hook is installed (a triton.knobs HookChain with calls, or a callable)."""
    if not _KNOBS:
        from triton import knobs

        _KNOBS.append(knobs.runtime)
    rt = _KNOBS[0]
    return any(bool(getattr(h, "calls", h)) for h in (rt.launch_enter_hook, rt.launch_exit_hook))
