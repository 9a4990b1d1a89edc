"""HLAConfig(abc="offload"): the ABC codes wait for backward in pinned host memory
(hot.nn.offload). The codes are the ones "save" forms (same pass, seeds and x), only their
place differs, so the gradients equal "save"'s bit for bit, eagerly and under torch.compile,
with and without sibling layers sharing their input's codes; a wrong entry handed back (another
layer's codes) or a copy read before it landed would move g_W by whole quantization steps.
On a CPU there is nothing to move: "offload" is "save". Under CUDA graphs it raises, naming the
fix. The host-side bookkeeping (which copies back start, nearest first, within the window; how
far the host may run ahead of the copies out) is tested on any machine with stand-in events."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot
from hot.analysis.saved import SavedTensorMeter
from hot.nn import offload

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class Block(nn.Module):
    """Two sibling layers reading one input (q, k), their sum through a third."""

    def __init__(self, d=64):
        super().__init__()
        self.q, self.k, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 32)

    def forward(self, x):
        return self.o(torch.relu(self.q(x)) * self.k(x))


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 64), nn.GELU(), Block(), nn.Linear(32, 10))


def _grads(abc: str, device: str, share: str = "none", compiled: bool = False, steps: int = 3):
    cfg = hot.HOTConfig.quantized().replace(seed=3, hla={"abc": abc, "share": share})
    m = hot.convert(copy.deepcopy(_net()), cfg, backend="fast" if device == "cuda"
                    else "reference").to(device)
    f = torch.compile(m) if compiled else m
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(256, 48, generator=g).to(device) for _ in range(steps)]
    out = []
    for x in xs:
        m.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            y = f(x)
        y.float().square().mean().backward()
        out.append({k: p.grad.clone() for k, p in m.named_parameters()})
    return out


def _assert_equal(a, b):
    for step, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), f"step {step}: {k} differs by {(x[k] - y[k]).abs().max()}"


def test_offload_on_a_cpu_is_save():
    _assert_equal(_grads("save", "cpu"), _grads("offload", "cpu"))
    assert offload.pending_entries() == 0


def test_offload_is_a_valid_choice_and_others_are_not():
    assert hot.HLAConfig(abc="offload").abc == "offload"
    with pytest.raises(hot.HOTConfigError, match="HLAConfig.abc"):
        hot.HLAConfig(abc="host")


@gpu
@needs_cuda
@pytest.mark.parametrize("share", ["none", "siblings"])
@pytest.mark.parametrize("compiled", [False, True])
def test_offload_gives_the_save_gradients_on_a_gpu(share, compiled):
    _assert_equal(_grads("save", "cuda", share, compiled), _grads("offload", "cuda", share, compiled))
    torch.cuda.synchronize()
    # entries go with their autograd nodes: after 3 steps of 4 or more entries each, at most
    # the last forward's one may still be held (eagerly by the sibling layers' cache of their
    # shared pass, hot.nn.autograd._shared_x_codes; under compile by the compiled graph)
    assert offload.pending_entries() <= 1


@gpu
@needs_cuda
def test_offloaded_codes_leave_the_gpu():
    """After the forward (copies done), "offload" holds less GPU memory than "save" by the
    codes: rank 8 of 16 int8 codes of every HOT layer's input, (tokens / 2) x in_features
    bytes, 8192 tokens through Linear(1024, 1024) x 4 = 16 MiB; at least 15 MiB asserted (the
    scales, a float per input channel, stay)."""
    torch.manual_seed(0)
    base = nn.Sequential(*[nn.Linear(1024, 1024, bias=False) for _ in range(4)]).cuda()
    x = torch.randn(8192, 1024, device="cuda")
    live = {}
    for abc in ("save", "offload"):
        m = hot.convert(copy.deepcopy(base), hot.HOTConfig(seed=1).replace(hla={"abc": abc}),
                        backend="fast")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            m(x).float().sum().backward()  # plans registered, pinned blocks cached
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with torch.autocast("cuda", dtype=torch.bfloat16), SavedTensorMeter(m) as meter:
            y = m(x)
        offload.settle()  # every copy out seen done; an allocation lets the allocator free
        torch.empty(1, device="cuda")  # the blocks it kept for them
        live[abc] = torch.cuda.memory_allocated() - before
        host = meter.by_dtype().get("int8 (host)", 0)
        assert host == (16 << 20 if abc == "offload" else 0), meter.by_dtype()
        assert meter.total - meter.home_total == host  # what takes no GPU memory
        y.float().sum().backward()
        del m, y
    assert live["save"] - live["offload"] >= 15 << 20, live


@gpu
@needs_cuda
def test_offload_refuses_cuda_graph_capture():
    m = hot.convert(nn.Linear(64, 64).cuda(), hot.HOTConfig(seed=1).replace(hla={"abc": "offload"}),
                    backend="fast")
    x = torch.randn(64, 64, device="cuda")
    m(x).sum().backward()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="abc='save' or 'recompute'"):
            with torch.cuda.graph(g, stream=s):
                m(x)


class _Event:
    """A stand-in for torch.cuda.Event: done or not, and whether the host waited on it."""

    def __init__(self, done=False):
        self.done, self.waited = done, False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = self.done = True


def _entries(monkeypatch, sizes):
    """Fresh registry entries of ``sizes`` bytes in forward order, with their host tensors (kept
    alive by the returned list); _start records the keys it is asked to copy back."""
    monkeypatch.setattr(offload, "_ENTRIES", offload.OrderedDict())
    started = []

    def start(e, host, device):
        started.append(host.data_ptr())
        e.gpu = host

    monkeypatch.setattr(offload, "_start", start)
    hosts = [torch.empty(n, dtype=torch.int8) for n in sizes]
    for h in hosts:
        offload._ENTRIES[h.data_ptr()] = offload._Entry(h.numel(), offload.weakref.ref(h),
                                                        _Event(True))
    return hosts, started


def test_prefetch_takes_the_next_backwards_nearest_first_within_the_window(monkeypatch):
    mib = 1 << 20
    monkeypatch.setattr(offload, "PREFETCH_BYTES", 160 * mib)
    # one layer's entries in forward order: q/k/v, o, gate/up, down; then the next layer's
    hosts, started = _entries(monkeypatch, [32 * mib, 32 * mib, 32 * mib, 128 * mib] * 2)
    key = lambda i: hosts[i].data_ptr()  # noqa: E731
    dev = torch.device("cpu")
    with offload._LOCK:
        offload._prefetch(key(7), dev)  # the second layer's down: its gate/up, o, q/k/v next
    assert started == [key(6), key(5), key(4)]  # 96 MiB; the first layer's down would pass 160
    for i in (6, 5):
        offload._ENTRIES[key(i)].asked = True  # their backwards ran
    with offload._LOCK:
        offload._prefetch(key(5), dev)  # pending: q/k/v's 32 MiB; the first down's 128 fits
    assert started[3:] == [key(3)]
    hosts[2] = None  # an entry whose host tensor is gone is skipped
    offload._ENTRIES[key(3)].asked = offload._ENTRIES[key(4)].asked = True
    with offload._LOCK:
        offload._prefetch(key(3), dev)
    assert started[4:] == [key(1), key(0)]


def test_put_bounds_the_host_lead_over_the_copies_out(monkeypatch):
    mib = 1 << 20
    monkeypatch.setattr(offload, "_BACKLOG", offload.deque())
    events = [_Event(), _Event(), _Event(), _Event()]
    events[0].done = True
    for e in events:
        offload._BACKLOG.append((e, 100 * mib))
    with offload._LOCK:
        offload._bound_backlog(150 * mib)
    # the finished head is forgotten without a wait (300 MiB outstanding); then the host waits
    # for the oldest until at most 150 MiB are: two waits (200, then 100 MiB), the newest left
    assert [e.waited for e in events] == [False, True, True, False]
    assert [n for _, n in offload._BACKLOG] == [100 * mib] and offload._BACKLOG[0][0] is events[3]


def test_get_waits_for_the_copies_out_and_a_split_layer_prefetches_nothing(monkeypatch):
    """The bookkeeping of get: the copies out still outstanding are waited for (none is counted
    at the backward's peak); with prefetch=False (an output layer's chunked backward) only the
    asked entry is copied back; the next get starts the copies back behind it."""
    mib = 1 << 20
    monkeypatch.setattr(offload, "PREFETCH_BYTES", 160 * mib)
    monkeypatch.setattr(offload, "_BACKLOG", offload.deque())
    hosts, started = _entries(monkeypatch, [32 * mib, 32 * mib, 128 * mib, 32 * mib])
    outs = [_Event(), _Event()]
    for ev in outs:
        offload._BACKLOG.append((ev, 16 * mib))  # far below BACKLOG_BYTES: put left them
    key = lambda i: hosts[i].data_ptr()  # noqa: E731
    dev = torch.device("cpu")
    with offload._LOCK:
        offload._ask(offload._ENTRIES[key(3)], key(3), hosts[3], dev, prefetch=False)
    assert all(ev.waited for ev in outs) and not offload._BACKLOG
    assert started == [key(3)] and offload._ENTRIES[key(3)].asked
    with offload._LOCK:
        offload._ask(offload._ENTRIES[key(2)], key(2), hosts[2], dev, prefetch=True)
    assert started == [key(3), key(2), key(1), key(0)]  # its own, then 64 MiB ahead


def test_prefetch_starts_the_nearest_entry_even_beyond_the_window(monkeypatch):
    """With nothing in flight, the nearest entry is started however large (it is asked for next:
    waiting for it then would only stall); with one in flight, the window holds."""
    mib = 1 << 20
    monkeypatch.setattr(offload, "PREFETCH_BYTES", 64 * mib)
    hosts, started = _entries(monkeypatch, [32 * mib, 128 * mib, 32 * mib])
    key = lambda i: hosts[i].data_ptr()  # noqa: E731
    with offload._LOCK:
        offload._prefetch(key(2), torch.device("cpu"))
    assert started == [key(1)]  # 128 MiB > 64, started alone; the 32 MiB after it waits
