"""hot.fast.native on the CPU: what it refuses to launch natively, and that it stays out of the way.

The launches themselves need a GPU (tests/fast/test_native_gpu.py); here: the mapping from Triton
signatures to argument kinds, the reasons a compiled kernel is refused, and that CPU tensors and
the reference backend never reach the native path.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hot.common import ops
from hot.fast import native

from _fast_diff import hla_args, hq_args


def test_kinds_of_signature():
    sig = {"x_ptr": "*bf16", "sxr": "i32", "sxc": "constexpr", "n": "i64", "out": "*i8",
           "BLOCK": "constexpr"}
    assert native.kinds_of(sig) == "picl" + "pc"
    assert native.kinds_of({"a": "*fp32", "f": "fp32"}) is None  # float arguments: not supported
    assert native.kinds_of({"a": ("*fp32", "*fp32")}) is None  # tuples
    assert native.kinds_of({"d": "tensordesc<bf16[64, 64]>"}) is None


def _kernel(**md):
    meta = dict(global_scratch_size=0, profile_scratch_size=0, num_ctas=1,
                launch_cooperative_grid=False, launch_pdl=False, num_warps=4, shared=0)
    meta.update(md)
    sig = {"x": "*bf16", "n": "i32", "one": "constexpr", "B": "constexpr"}
    return SimpleNamespace(function=1234, metadata=SimpleNamespace(**meta),
                           src=SimpleNamespace(signature=sig))


def test_off_reasons():
    assert native._off_reason(_kernel(), 3) is None
    assert native._off_reason(_kernel(), 2) is None  # a constexpr-only tail
    assert "scratch" in native._off_reason(_kernel(global_scratch_size=64), 3)
    assert "scratch" in native._off_reason(_kernel(profile_scratch_size=8), 3)
    assert "launch attributes" in native._off_reason(_kernel(num_ctas=2), 3)
    assert "launch attributes" in native._off_reason(_kernel(launch_pdl=True), 3)
    assert "runtime arguments" in native._off_reason(_kernel(), 1)  # 'n' would be left out
    assert "runtime arguments" in native._off_reason(_kernel(), 5)
    k = _kernel()
    k.function = None
    assert "not loaded" in native._off_reason(k, 3)


def test_cpu_and_reference_never_native():
    import hot.fast  # noqa: F401  (registers the fast implementations)
    from hot.fast import backward

    gy, w, x = torch.randn(32, 16), torch.randn(16, 16), torch.randn(32, 16)
    codes = ops.hla_quantize(x, hla_args(8, "lowpass", 8, "row", True, 1), "reference")
    args = (gy, w.t(), codes, hq_args(4, "row", True, 2), hla_args(8, "lowpass", 8, "row", True, 3),
            hq_args(4, "row", True, 4), torch.float32, torch.float32, False)
    assert backward.layer_backward(*args) is None  # CPU tensors
    assert ops.layer_backward(*args, "reference") is None  # the reference has no one-call path
    assert ops.implementation("layer_backward", "fast") is backward.layer_backward


def test_native_launch_is_a_route_behind_run_pass(monkeypatch):
    """Every pass starts at quantize.run_pass: a registered route that has the plan runs the
    pass (its outputs returned as they are, no Python launch); where no route has it, the pass
    launches from Python and each route is offered the plan's kernels. hot.fast registers the
    native C++ launch as such a route."""
    from hot.fast import passes
    from hot.fast import quantize as fq

    assert native.ROUTE in fq._ROUTES
    x = torch.randn(40, 24)
    hq, hla = hq_args(4, "row", False, 1), hla_args(8, "lowpass", 8, "row", False, 2)
    p = passes.plan_for(x, hq, hla)
    monkeypatch.setattr(fq, "_ROUTES", [])
    want = fq.gy_pass(x, hq, hla)
    seen = []
    declines = passes.PassRoute(run=lambda x_, p_, *a: seen.append(("run", p_)),
                                adopt=lambda p_, x_, ks, kq, nargs: seen.append(("adopt", p_)))
    fq.register_route(declines)
    got = fq.gy_pass(x, hq, hla)
    assert seen == [("run", p), ("adopt", p)]
    for a, b in zip(got, want):
        assert (a is None and b is None) or torch.equal(a, b)
    done = passes.PassOutputs(*want)
    has_it = passes.PassRoute(run=lambda x_, p_, *a: done if p_ is p else None,
                              adopt=lambda *a: seen.append("adopted"))
    monkeypatch.setattr(fq, "_ROUTES", [has_it, declines])
    seen.clear()
    assert fq.gy_pass(x, hq, hla) is done and seen == []
