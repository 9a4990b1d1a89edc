"""Host (CPU) microseconds of each piece of a HOT layer's backward, on tiny tensors so that the GPU
never holds the host back: which Python steps the per-layer overhead is made of.

    python benchmarks/host_breakdown.py [--n 300]

Each line is the median wall time of one call over ``n`` calls (the GPU queue is drained every 50
calls so it never fills up). Needs a CUDA GPU; the CUTLASS extension is used when it loads.
"""

from __future__ import annotations

import argparse
import time

import torch


def wall_us(fn, n: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ts = []
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
        if i % 50 == 49:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    ts.sort()
    return ts[n // 2] * 1e6


class _Noop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return g @ w, w


def main() -> None:
    import hot
    from hot.common import ops
    from hot.fast import gemm
    from hot.fast import quant as fq
    from hot.nn.state import begin_backward, make_plan

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=300)
    a = p.parse_args()
    n = a.n
    L, I, O = 256, 64, 64
    dev = "cuda"
    g = torch.randn(L, O, device=dev, dtype=torch.bfloat16)
    w = torch.randn(O, I, device=dev, dtype=torch.bfloat16)
    x = torch.randn(L, I, device=dev, dtype=torch.bfloat16, requires_grad=True)
    rows = []

    def add(name, fn):
        try:
            rows.append((name, wall_us(fn, n)))
        except Exception as e:  # one failing piece must not hide the others
            rows.append((name, f"{type(e).__name__}: {e}"[:120]))

    add("torch.empty (1 KiB)", lambda: torch.empty(256, device=dev))
    add("tensor.fill_ (0-d buffer)", lambda: w[0, 0].fill_(1))
    add("gy_pass HQ only (W^T, 2 launches)", lambda: fq.gy_pass(w.t(), (4, "row", True, 3), None))
    add("gy_pass fused HQ+HLA (2 launches)",
        lambda: fq.gy_pass(g, (4, "row", True, 1), (8, "lowpass", 8, "row", True, 2)))
    add("fast.quant.hq_quantize (W^T)", lambda: fq.hq_quantize(w.t(), 4, "row", True, 3))
    add("ops.direct.hq_quantize (W^T)", lambda: ops.direct.hq_quantize(w.t(), 4, "row", True, 3, "fast"))
    add("ops.direct.gy_quantize",
        lambda: ops.direct.gy_quantize(g, 4, "row", True, 1, 8, "lowpass", 8, "row", True, 2, "fast"))
    qg, sg, qh, sh = fq.gy_quantize(g, 4, "row", True, 1, 8, "lowpass", 8, "row", True, 2)
    qw, sw = fq.hq_quantize(w.t(), 4, "row", True, 3)
    qx, sx = fq.hla_quantize(x.detach(), 8, "lowpass", 8, "row", True, 4)
    add(f"gemm.int_gemm_nt g_x ({gemm.gemm_path(qg, qw)})",
        lambda: gemm.int_gemm_nt(qg, qw, sg, sw, torch.bfloat16))
    add(f"gemm.int_gemm_nt g_W ({gemm.gemm_path(qh, qx)})",
        lambda: gemm.int_gemm_nt(qh, qx, sh, sx, torch.bfloat16))
    add("gemm.gemm_path", lambda: gemm.gemm_path(qg, qw))
    layer = hot.convert(torch.nn.Sequential(torch.nn.Linear(I, O, bias=False)), hot.HOTConfig(seed=0),
                        backend="fast").cuda().to(torch.bfloat16)[0]
    layer(x).backward(torch.randn(L, O, device=dev, dtype=torch.bfloat16))  # LQS calibration
    plan = make_plan(layer, layer.hot_config, "fast", 0)
    add("state.make_plan (forward)", lambda: make_plan(layer, layer.hot_config, "fast", 0))
    add("state.begin_backward", lambda: begin_backward(layer, plan, g))
    lin = torch.nn.Linear(I, O, bias=False, device=dev, dtype=torch.bfloat16)
    add("autograd: nn.Linear fwd+bwd", lambda: torch.autograd.grad(lin(x), (x, lin.weight), g))
    add("autograd: Python Function fwd+bwd (no work)",
        lambda: torch.autograd.grad(_Noop.apply(x, lin.weight), (x, lin.weight), g))
    add("HOTLinear forward (grad on)", lambda: layer(x))
    raw = getattr(type(layer).forward, "__wrapped__", None)
    if raw is not None:
        add("HOTLinear forward without the compiler.disable wrapper", lambda: raw(layer, x))
    y = layer(x)
    add("HOTLinear fwd+bwd", lambda: torch.autograd.grad(layer(x), (x, layer.weight), g))
    from hot.nn.function import abc_save, hot_backward

    saved = abc_save(plan, x.detach())
    add("function.abc_save (forward ABC)", lambda: abc_save(plan, x.detach()))
    add("function.hot_backward (no autograd)",
        lambda: hot_backward(layer, plan, g, layer.weight.detach(), saved, True, True,
                             torch.bfloat16, torch.bfloat16))
    # hot_backward's steps in sequence, each timed by perf_counter deltas (medians over n calls).
    from hot.common.ops import direct as op

    wd = layer.weight.detach()
    steps = {k: [] for k in ("begin_backward", "gy_quantize", "hq_quantize W", "gemm g_x", "gemm g_W")}
    for i in range(n + 20):
        t = [time.perf_counter()]
        bp = begin_backward(layer, plan, g)
        t.append(time.perf_counter())
        f = op.gy_quantize(g, bp.gx_bits, bp.gy_scale_mode, True, bp.seed_gy, 8, "lowpass", 8, "row",
                           True, bp.seed_hla, "fast")
        t.append(time.perf_counter())
        qw_, sw_ = op.hq_quantize(wd.t(), bp.gx_bits, "row", True, bp.seed_w, "fast")
        t.append(time.perf_counter())
        op.int_gemm_nt(f[0], qw_, f[1], sw_, "bfloat16", "fast")
        t.append(time.perf_counter())
        op.int_gemm_nt(f[2], saved[0], f[3], saved[1], "bfloat16", "fast")
        t.append(time.perf_counter())
        if i >= 20:
            for k, a0, a1 in zip(steps, t, t[1:]):
                steps[k].append((a1 - a0) * 1e6)
        if i % 50 == 49:
            torch.cuda.synchronize()
    for k, v in steps.items():
        v.sort()
        print(f"in sequence: {k:<16} {v[len(v) // 2]:8.1f} us")
    # The same hot_backward call from the main thread and from another Python thread (autograd
    # runs a CUDA backward on its own device thread).
    import threading

    def hb_loop(out):
        ts = []
        for i in range(n + 20):
            t0 = time.perf_counter()
            hot_backward(layer, plan, g, wd, saved, True, True, torch.bfloat16, torch.bfloat16)
            if i >= 20:
                ts.append((time.perf_counter() - t0) * 1e6)
            if i % 50 == 49:
                torch.cuda.synchronize()
        ts.sort()
        out.append(ts[len(ts) // 2])

    res: list = []
    hb_loop(res)
    th = threading.Thread(target=hb_loop, args=(res,))
    th.start()
    th.join()
    print(f"hot_backward: main thread {res[0]:.1f} us, other Python thread {res[1]:.1f} us")
    # Timeline of one HOTLinear forward+backward: marks inside the autograd function (patched
    # in for this measurement only), medians over n calls of the gap between consecutive marks.
    import hot.nn.function as hf

    marks = []
    orig_fwd, orig_bwd, orig_hb = (hf.HOTLinearFunction.forward, hf.HOTLinearFunction.backward,
                                   hf.hot_backward)

    def fwd(ctx, *a):
        marks.append(("Function.forward entered", time.perf_counter()))
        out = orig_fwd(ctx, *a)
        marks.append(("Function.forward done", time.perf_counter()))
        return out

    def bwd(ctx, *a):
        marks.append(("Function.backward entered", time.perf_counter()))
        out = orig_bwd(ctx, *a)
        marks.append(("Function.backward done", time.perf_counter()))
        return out

    def hb(*a):
        marks.append(("hot_backward entered", time.perf_counter()))
        out = orig_hb(*a)
        marks.append(("hot_backward done", time.perf_counter()))
        return out

    hf.HOTLinearFunction.forward, hf.HOTLinearFunction.backward = staticmethod(fwd), staticmethod(bwd)
    hf.hot_backward = hb
    gaps: dict = {}
    for i in range(n + 20):
        marks.clear()
        marks.append(("start", time.perf_counter()))
        y_ = layer(x)
        marks.append(("layer(x) returned", time.perf_counter()))
        torch.autograd.grad(y_, (x, layer.weight), g)
        marks.append(("grad() returned", time.perf_counter()))
        if i >= 20:
            for (_, a0), (nm, a1) in zip(marks, marks[1:]):
                gaps.setdefault(nm, []).append((a1 - a0) * 1e6)
        if i % 50 == 49:
            torch.cuda.synchronize()
    hf.HOTLinearFunction.forward, hf.HOTLinearFunction.backward = (staticmethod(orig_fwd),
                                                                    staticmethod(orig_bwd))
    hf.hot_backward = orig_hb
    for nm, v in gaps.items():
        v.sort()
        print(f"timeline: ... -> {nm:<28} {v[len(v) // 2]:8.1f} us")
    # Which CUDA launches one HOT forward+backward makes (names and count).
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(layer(x), (x, layer.weight), g)
        torch.cuda.synchronize()
    ev = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"GPU kernels/memsets in one HOTLinear fwd+bwd: {len(ev)}, "
          f"{sum(e.device_time for e in ev):.1f} us of GPU time in all")
    for e in ev:
        print(f"  {e.device_time:7.1f} us  {e.name[:100]}")
    # Wall time against GPU time (events) over 50 back-to-back fwd+bwd calls: which one bounds?
    a_, b_ = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    a_.record()
    for _ in range(50):
        torch.autograd.grad(layer(x), (x, layer.weight), g)
    b_.record()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    print(f"50 x HOTLinear fwd+bwd: host {1e6 * (t1 - t0) / 50:.1f} us/call to enqueue, "
          f"GPU span {1e3 * a_.elapsed_time(b_) / 50:.1f} us/call")
    w_ = max(len(r[0]) for r in rows)
    for name, v in rows:
        print(f"{name:<{w_}}  {v:8.1f} us" if isinstance(v, float) else f"{name:<{w_}}  {v}")
    del y


if __name__ == "__main__":
    main()
