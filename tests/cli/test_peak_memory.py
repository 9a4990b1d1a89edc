"""hot.analysis.peak: the live allocations at a step's peak, from the allocator's trace."""

import pytest
import torch

from hot.analysis.peak import BEFORE, PACKAGE_DIR, origin, record_peak, replay

HOT_BWD = [dict(filename=PACKAGE_DIR + "fast/native.py", name="layer_backward"),
           dict(filename=PACKAGE_DIR + "nn/autograd.py", name="_layer_bwd"),
           dict(filename="/usr/lib/torch/_functorch/_aot_autograd/runtime_wrappers.py",
                name="backward")]
GRAPH_FWD = [dict(filename="/tmp/ind/ab/cabc.py", name="call"),
             dict(filename="/usr/lib/torch/_functorch/_aot_autograd/runtime_wrappers.py",
                  name="forward")]


def _alloc(addr, size, frames=()):
    return dict(action="alloc", addr=addr, size=size, frames=list(frames))


def _free(addr, size):
    return dict(action="free_completed", addr=addr, size=size)


@pytest.fixture(autouse=True)
def _graph_code_in_tmp_ind(monkeypatch):
    """Inductor's generated code where TORCHINDUCTOR_CACHE_DIR puts it (/tmp/ind)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/ind")


def test_origin_names_the_innermost_package_frame_then_the_graph_then_the_caller():
    assert origin(HOT_BWD) == "hot/fast/native.py:layer_backward (backward)"
    assert origin(HOT_BWD[:2]) == "hot/fast/native.py:layer_backward"
    # the harness that runs the step is not an origin: the graph under it is
    harness = [dict(filename=PACKAGE_DIR + "bench/e2e.py", name="step")]
    assert origin(GRAPH_FWD + harness) == "compiled forward"
    assert origin([GRAPH_FWD[0], HOT_BWD[2]]) == "compiled backward"
    # a graph's own buffer, though a module of this package is further out on the stack
    outer = [dict(filename=PACKAGE_DIR + "nn/modules.py", name="forward")]
    assert origin(GRAPH_FWD + outer) == "compiled forward"
    assert origin(HOT_BWD[:1] + GRAPH_FWD) == "hot/fast/native.py:layer_backward"
    assert origin([dict(filename="/usr/lib/torch/optim/adamw.py", name="_fused_adamw")]) \
        == "optimizer"
    assert origin([dict(filename="/usr/lib/torch/nn/functional.py", name="linear"),
                   dict(filename="/home/u/train.py", name="main")]) == "train.py:main"
    assert origin([]) == "eager (torch)"
    # an eager backward of a torch op, whoever called backward (a script, `hot memory`)
    eager_bwd = [dict(filename="/usr/lib/torch/autograd/__init__.py", name="backward")]
    assert origin(eager_bwd + [dict(filename="/home/u/train.py", name="main")]) \
        == "eager backward"
    assert origin(eager_bwd + [dict(filename=PACKAGE_DIR + "cli/memory.py", name="run")]) \
        == "eager backward"
    # the command line is a harness: a model's allocation under it is the model's
    model = [dict(filename="/usr/lib/transformers/modeling_llama.py", name="forward"),
             dict(filename=PACKAGE_DIR + "cli/memory.py", name="run")]
    assert origin(model) == "modeling_llama.py:forward"
    # a user's own folder named hot is not this package
    assert origin([dict(filename="/home/u/hot/train.py", name="main")]) == "train.py:main"
    # the same file outside Inductor's cache directory is a caller, not a graph
    assert origin([dict(filename="/tmp/other/ab/cabc.py", name="call")]) == "cabc.py:call"


def test_replay_finds_the_peak_and_what_is_live_there():
    events = [
        _alloc(1, 100, HOT_BWD),
        dict(action="segment_alloc", addr=50, size=4096),  # cudaMalloc: not allocated bytes
        _alloc(2, 300, GRAPH_FWD),
        dict(action="free_requested", addr=1, size=100),  # counted when completed
        _free(7, 40),  # allocated before the window: lowers BEFORE
        _alloc(3, 60, GRAPH_FWD),  # 1000 + 100 + 300 - 40 + 60 = 1420: the peak
        _free(1, 100),
        _free(3, 60),
        _alloc(4, 120, HOT_BWD),  # 1380: below the peak, not live there
    ]
    r = replay(events, before=1000)
    assert r.peak_bytes == 1420
    assert r.at == "compiled forward"
    shares = dict(r.by_origin)
    assert shares == {BEFORE: 960, "compiled forward": 360,
                      "hot/fast/native.py:layer_backward (backward)": 100}
    assert sum(shares.values()) == r.peak_bytes
    assert [s.bytes for s in r.by_origin] == sorted(shares.values(), reverse=True)


def test_replay_of_a_window_that_never_exceeds_its_start():
    r = replay([_free(9, 10), _alloc(1, 5)], before=100)
    assert (r.peak_bytes, r.at, dict(r.by_origin)) == (100, BEFORE, {BEFORE: 100})


def test_as_gib_keeps_the_largest_origins_and_sums_the_rest():
    gib = 2**30
    events = [_alloc(i, (i + 1) * gib, [dict(filename=f"/u/m{i}.py", name="f")])
              for i in range(4)]
    out = replay(events, before=0).as_gib(top=2)
    assert out["peak_GiB"] == 10.0 and out["at"] == "m3.py:f"
    assert out["live_GiB"] == {"m3.py:f": 4.0, "m2.py:f": 3.0, "other": 3.0}


def test_record_peak_refuses_a_device_without_the_caching_allocator():
    with pytest.raises(ValueError, match="device cpu.*CUDA device"):
        record_peak(lambda: None, torch.device("cpu"))


@pytest.mark.gpu
def test_record_peak_matches_the_allocators_peak_on_a_gpu():
    dev = torch.device("cuda")
    keep = torch.empty(1 << 20, device=dev)  # live before and through the step

    def step():
        a = torch.empty(3 << 20, device=dev)
        b = torch.empty(5 << 20, device=dev)
        del a
        c = torch.empty(1 << 20, device=dev)
        return b, c

    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r = record_peak(step, dev)
    assert r.peak_bytes == torch.cuda.max_memory_allocated()
    assert dict(r.by_origin)[BEFORE] == start
    assert r.peak_bytes - start == (3 + 5) * 4 << 20
    del keep
