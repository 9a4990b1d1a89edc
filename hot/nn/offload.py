"""ABC codes kept in host memory (HLAConfig(abc="offload")).

The forward forms a layer's ABC codes on the GPU, as with "save", and keeps a pinned host copy
instead of the GPU tensor: ``put`` starts the device-to-host copy on a side stream and returns
the host tensor; the GPU codes are freed once that copy has read them (``record_stream``). The
backward asks for them back with ``get``, which brings them to the GPU on a second side stream
(so copies back never queue behind copies out: the host link moves both ways at once) and also
starts the copies of the codes the next backwards will ask for: the entries formed before this
one in the forward, up to PREFETCH_BYTES not yet asked for, so each copy runs beside the GPU
work of the layers in between; the main stream waits on an event.

The caching allocator frees a block on the host's clock: a copy's GPU codes count as allocated
until the host has seen the copy finish. The host runs ahead of the GPU (under torch.compile by
up to a step), so without a bound it would reach the backward, the step's peak, with most
copies not yet seen done and the codes still counted. ``put`` therefore waits, on the host,
whenever more than BACKLOG_BYTES of copies out are outstanding: the host stays within that many
bytes of codes of the copies, which at 55 GB/s (an H100's link, measured) keep up with a
forward forming 3.5 GiB of codes in about 100 ms, so the GPU is not starved. The first ``get``
of a backward waits for the rest, so none is counted at the backward's peak; and the backward
of a layer whose g_y is the step's largest tensor (an LM's output layer) starts no copies back
but its own, so none adds to that peak either (``_ask``).

Why it pays: the codes are a quarter of a bf16 input at rank 8; the GPU keeps at most the
backlog and the prefetch window of them, and recompute ("recompute"), which saves the same
memory, costs the GPU the passes over x in backward (docs/performance.md). Entries are keyed by
the host tensor's address and dropped when autograd frees it (a weak reference), which frees
the GPU copy too.

Not under CUDA graphs: which codes to copy and when is decided on the host per call, which a
replay would not redo (hot.nn.autograd raises at capture). On a CPU there is nothing to move:
"offload" keeps the codes as "save" does.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Optional

import torch

# Copies back started ahead of the backward that needs them, in bytes not yet asked for: a
# Llama-1b layer's largest codes (down's, 128 MiB at 32k tokens) and a sibling group's, so the
# next layer's are on their way while attention's backward runs.
PREFETCH_BYTES = 160 << 20
# Copies out the host may leave unfinished before it waits for the oldest (see above).
BACKLOG_BYTES = 256 << 20


@dataclass
class _Entry:
    nbytes: int
    host: "weakref.ref[torch.Tensor]"
    out: torch.cuda.Event  # recorded after the copy out
    gpu: Optional[torch.Tensor] = None  # the copy brought back, once started
    ready: Optional[torch.cuda.Event] = None  # recorded after that copy
    asked: bool = False  # get() returned it: it no longer counts as prefetched


_LOCK = threading.Lock()
_ENTRIES: "OrderedDict[int, _Entry]" = OrderedDict()  # host address -> entry, forward order
_BACKLOG: "deque[tuple[torch.cuda.Event, int]]" = deque()  # copies out, oldest first
_STREAMS: dict = {}


def _stream(device: torch.device, way: str) -> torch.cuda.Stream:
    """The side stream of ``device`` for copies out ("d2h") or back ("h2d")."""
    s = _STREAMS.get((device.index, way))
    if s is None:
        s = _STREAMS[(device.index, way)] = torch.cuda.Stream(device)
    return s


def _drop(key: int) -> None:
    with _LOCK:
        _ENTRIES.pop(key, None)


def _bound_backlog(limit: int) -> None:
    """Forget the finished copies out at the backlog's head; then wait, oldest first, until at
    most ``limit`` bytes are outstanding. Called with _LOCK held."""
    while _BACKLOG and _BACKLOG[0][0].query():
        _BACKLOG.popleft()
    left = sum(n for _, n in _BACKLOG)
    while _BACKLOG and left > limit:
        ev, n = _BACKLOG.popleft()
        ev.synchronize()
        left -= n


def put(t: torch.Tensor) -> torch.Tensor:
    """A pinned host tensor that will hold ``t`` (a CUDA tensor; returned as is elsewhere), the
    copy started on the side stream after the work enqueued so far on the current stream."""
    if t.device.type != "cuda" or t.numel() == 0:
        return t
    main = torch.cuda.current_stream(t.device)
    side = _stream(t.device, "d2h")
    side.wait_stream(main)
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    with torch.cuda.stream(side):
        host.copy_(t, non_blocking=True)
        out = torch.cuda.Event()
        out.record(side)
    t.record_stream(side)  # its memory is not reused before the copy has read it
    key, nbytes = host.data_ptr(), t.numel() * t.element_size()
    with _LOCK:
        _ENTRIES[key] = _Entry(nbytes, weakref.ref(host), out)
        _BACKLOG.append((out, nbytes))
        _bound_backlog(BACKLOG_BYTES)
    weakref.finalize(host, _drop, key)
    return host


def _start(e: _Entry, host: torch.Tensor, device: torch.device) -> None:
    """Start e's copy back on the h2d side stream, after its copy out and after the current
    stream's work so far (the GPU block may have been freed by that work)."""
    main = torch.cuda.current_stream(device)
    side = _stream(device, "h2d")
    gpu = torch.empty(host.shape, dtype=host.dtype, device=device)
    side.wait_stream(main)
    side.wait_event(e.out)
    with torch.cuda.stream(side):
        gpu.copy_(host, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(side)
    gpu.record_stream(side)
    e.gpu, e.ready = gpu, ready


def get(host: torch.Tensor, device: torch.device, prefetch: bool = True) -> torch.Tensor:
    """``host`` (from ``put``) on ``device``, the current stream made to wait for its copy
    back (``_ask``). A tensor ``put`` did not make (or whose entry is gone) is copied here, on
    the current stream."""
    if host.device.type == "cuda" or device.type != "cuda":
        return host.to(device)
    key = host.data_ptr()
    with _LOCK:
        e = _ENTRIES.get(key)
        if e is None or e.host() is not host:
            return host.to(device, non_blocking=True)
        _ask(e, key, host, device, prefetch)
        gpu, ready = e.gpu, e.ready
    torch.cuda.current_stream(device).wait_event(ready)
    return gpu


def _ask(e: _Entry, key: int, host: torch.Tensor, device: torch.device, prefetch: bool) -> None:
    """The bookkeeping of ``get(host)``, in this order. (1) The host waits for every copy out
    still outstanding: a backward has begun, so the forward's are all enqueued, and the GPU codes
    they read are then freed before the backward's transients are allocated (the first
    backwards run at the step's peak). A forward run again inside the backward (activation
    checkpointing) makes this a host wait per layer: correct, slower. (2) e's copy back is
    started if a prefetch has not. (3) With ``prefetch``, the copies back of the entries before
    it in forward order are started, up to PREFETCH_BYTES not yet asked for; a backward whose
    g_y is the step's largest tensor (an LM's output layer, hot.nn.backward.splits_gy_pass)
    passes False, and the next ``get`` starts them once that g_y is freed. Called with _LOCK
    held."""
    _bound_backlog(0)
    if e.gpu is None:
        _start(e, host, device)
    e.asked = True
    if prefetch:
        _prefetch(key, device)


def _prefetch(key: int, device: torch.device) -> None:
    """Start the copies back of the entries before ``key`` in forward order (the next
    backwards'), nearest first, while the started and not yet asked-for bytes stay within
    PREFETCH_BYTES, or while none are (one entry larger than the window). Called with _LOCK
    held."""
    pending = sum(e.nbytes for e in _ENTRIES.values() if e.gpu is not None and not e.asked)
    keys = list(_ENTRIES)
    for k in reversed(keys[: keys.index(key)]):
        e = _ENTRIES[k]
        if e.gpu is not None:
            continue
        if pending and pending + e.nbytes > PREFETCH_BYTES:
            break  # the nearest entry not yet started always is (it is asked for next)
        host = e.host()
        if host is None:
            continue
        _start(e, host, device)
        pending += e.nbytes


def settle() -> None:
    """Wait for every copy out (tests: the allocator then frees the GPU codes at its next
    allocation)."""
    with _LOCK:
        _bound_backlog(0)


def pending_entries() -> int:
    """How many offloaded code tensors are alive (for tests)."""
    with _LOCK:
        return len(_ENTRIES)
