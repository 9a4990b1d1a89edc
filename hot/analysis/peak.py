"""What is live at a step's peak of allocated GPU memory, by where it was allocated.

``torch.cuda.max_memory_allocated`` gives the peak's height, not its make-up. The CUDA caching
allocator can record every allocation and free with the Python stack that made it
(``torch.cuda.memory._record_memory_history``). :func:`replay` walks such a trace in order,
keeping the allocated bytes, and at their largest groups the live allocations by origin
(:func:`origin`): the innermost frame that is in this package (a HOT operator's own buffers,
e.g. ``hot/fast/native.py:layer_backward (backward)``), in a torch.compile graph (its forward or
backward) or in the optimizer; else, inside an eager backward, ``eager backward``, and elsewhere
the innermost frame outside torch (the model's own code, the loss). What was allocated before
the recorded step and is still live at the peak (parameters, optimizer state, gradients kept
across steps) is one share, ``before the step``.
"""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict
from typing import Callable, Iterable, NamedTuple, Optional

import torch

BEFORE = "before the step"
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # .../hot/
_BACKWARD_FRAMES = ("backward", "call_compiled_backward")
# the harnesses that run the step (the benchmarks, the command line) and this module: never an
# allocation's origin
_SKIP = tuple(PACKAGE_DIR + d + os.sep for d in ("bench", "cli", "analysis"))


class PeakShare(NamedTuple):
    origin: str
    bytes: int


class PeakReport(NamedTuple):
    """peak_bytes: the largest allocated total in the recorded window (``before`` plus what it
    allocated minus what it freed); at: the origin of the allocation that reached it; by_origin:
    the live bytes at that moment, largest first, summing to peak_bytes."""

    peak_bytes: int
    at: str
    by_origin: tuple[PeakShare, ...]

    def as_gib(self, top: int = 10) -> dict:
        """The report in GiB (3 decimals) for a JSON record: the ``top`` largest origins and the
        rest summed as ``other``."""
        g = lambda n: round(n / 2**30, 3)  # noqa: E731
        shares = {s.origin: g(s.bytes) for s in self.by_origin[:top]}
        rest = sum(s.bytes for s in self.by_origin[top:])
        if rest:
            shares["other"] = g(rest)
        return {"peak_GiB": g(self.peak_bytes), "at": self.at, "live_GiB": shares}


def graph_code_dir() -> str:
    """The path prefix of torch.compile's generated graph code: Inductor's cache directory, which
    TORCHINDUCTOR_CACHE_DIR moves (read as Inductor's cache_dir reads it, without its side
    effects of creating the directory and setting the variable)."""
    env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if env:
        return os.path.abspath(env).rstrip("/") + "/"
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # a torch without that helper: its default location's prefix
        return tempfile.gettempdir() + "/torchinductor_"
    return default_cache_dir().rstrip("/") + "/"


def origin(frames: Iterable[dict], graph_dir: Optional[str] = None) -> str:
    """The origin of one allocation from its stack (innermost frame first, as the allocator's
    trace lists it; each frame a dict with ``filename``, ``name``): see the module docstring.
    ``graph_dir``: graph_code_dir(), read once by a caller that labels many stacks."""
    frames = list(frames)
    graph_dir = graph_code_dir() if graph_dir is None else graph_dir
    # An autograd Function's backward (HOT's, or a compiled graph's runtime wrapper) is on the
    # stack of whatever backward allocates; a name merely containing it (layer_backward) is not.
    backward = any(f.get("name") in _BACKWARD_FRAMES for f in frames)
    for f in frames:  # the innermost frame that names an origin
        fn = f.get("filename", "")
        if fn.startswith(PACKAGE_DIR) and not fn.startswith(_SKIP):
            where = "hot/" + fn[len(PACKAGE_DIR):].replace(os.sep, "/") + ":" + f.get("name", "?")
            return where + (" (backward)" if backward else "")
        if "/_inductor/" in fn or fn.startswith(graph_dir):
            return "compiled backward" if backward else "compiled forward"
        if "/torch/optim/" in fn:
            return "optimizer"
    if backward:  # an eager autograd backward of a torch op: whoever called backward is not it
        return "eager backward"
    for f in frames:
        fn = f.get("filename", "")
        if fn and "/torch/" not in fn and not fn.startswith("??"):
            return fn.rsplit("/", 1)[-1] + ":" + f.get("name", "?")
    return "eager (torch)"


def replay(events: Iterable[dict], before: int) -> PeakReport:
    """The peak of one recorded window: ``events`` are the allocator's trace for one device
    (actions ``alloc`` and ``free_completed`` count; segment and other actions do not, as in
    torch.cuda._memory_viz), ``before`` the bytes allocated when recording began. A free of
    memory allocated before the window lowers ``before the step``. Two passes: the first finds
    the event that reaches the peak, the second replays up to it and groups what is live."""
    events = [e for e in events if e.get("action") in ("alloc", "free_completed")]
    total = peak = before
    at_index = -1
    for i, e in enumerate(events):
        total += int(e["size"]) if e["action"] == "alloc" else -int(e["size"])
        if total > peak:
            peak, at_index = total, i
    live: dict[int, tuple[int, dict]] = {}
    from_before = before
    for e in events[:at_index + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = (int(e["size"]), e)
        elif live.pop(e["addr"], None) is None:
            from_before -= int(e["size"])
    graph_dir = graph_code_dir()
    by: dict[str, int] = defaultdict(int)
    by[BEFORE] = from_before
    for size, e in live.values():
        by[origin(e.get("frames", ()), graph_dir)] += size
    at = origin(events[at_index].get("frames", ()), graph_dir) if at_index >= 0 else BEFORE
    shares = tuple(PeakShare(o, b) for o, b in sorted(by.items(), key=lambda kv: -kv[1]) if b)
    return PeakReport(peak, at, shares)


def record_peak(step: Callable[[], object], device: torch.device,
                max_entries: int = 2_000_000) -> PeakReport:
    """Run ``step()`` once with the allocator's trace recording on ``device`` (CUDA) and
    :func:`replay` it. Raises ValueError for a device the caching allocator does not trace."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"record_peak: device {device} has no CUDA caching allocator to trace; "
                         "run it on a CUDA device")
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    mem = torch.cuda.memory
    mem._record_memory_history(enabled="all", context="alloc", stacks="python",
                               max_entries=max_entries, device=device)
    try:
        step()
        torch.cuda.synchronize(device)
        snap = mem._snapshot(device)
    finally:
        mem._record_memory_history(enabled=None, device=device)
    traces = snap.get("device_traces", [])
    index = device.index if device.index is not None else torch.cuda.current_device()
    events = traces[index] if index < len(traces) else []
    if len(events) >= max_entries:
        raise RuntimeError(f"record_peak: the trace filled max_entries={max_entries}; its start "
                           "is lost, so the peak cannot be placed. Pass a larger max_entries")
    return replay(events, before)
