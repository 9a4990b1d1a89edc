"""One ViT-B/16 training step (timm vit_base_patch16_224, random init, batch 128, bf16 autocast
forward, cross-entropy, backward, fused AdamW): HOT (fast backend) against plain bf16 autocast,
each with and without torch.compile. Median step time over timed steps after warm-up (CUDA
events) and peak allocated memory.

    python -m hot.bench.e2e [--modes bf16,bf16_compile,hot,hot_compile,hot_ref,hot_exact,
                                     bf16_compile_ro,hot_compile_ro,bf16_compile_rc,
                                     hot_compile_rc] [--json out.json]
                            [--profile]

*_compile_ro compiles with mode="reduce-overhead" (CUDA graphs, HOT's ops outside them).
*_compile_rc compiles with torch._functorch.config.ban_recompute_materialized_backward = False
(the partitioner may recompute tensors that backward materializes); hot_compile_rc also sets
HLAConfig(abc="recompute"), so the HOT layers keep nothing of their own.
hot_ref runs HOT on the reference backend inside quant.hash_rng() (the fast kernels' random
stream, so it is the same computation up to rare flipped codes); hot_exact runs the HOT layers
with HOTConfig.exact() (exact gradients through the same wrappers). Every mode records the loss of
every step (the same 2 alternating fixed batches), to tell HOT's noise from a fast-path bug.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback

import torch
import torch.nn.functional as F


def _model(mode: str):
    import timm

    torch.manual_seed(0)
    m = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=1000).cuda()
    if mode.startswith("hot"):
        import hot

        cfg = hot.HOTConfig.exact() if mode.startswith("hot_exact") else hot.HOTConfig(seed=0)
        if mode.endswith("_rc"):
            cfg = cfg.replace(hla={"abc": "recompute"})
        hot.convert(m, cfg, backend="reference" if mode.startswith("hot_ref") else "fast")
    return m


def _profile(step, n: int = 2, top: int = 14) -> dict:
    """GPU busy time per step (kernel durations summed, torch.profiler) and the kernels that
    take most of it, grouped by name: where a step's time goes beyond the linear layers."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            step(i)
        torch.cuda.synchronize()
    by = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by[e.name[:70]] += e.device_time / 1e3 / n
    busy = sum(by.values())
    return {"gpu_busy_ms": busy,
            "top_ms": [(k, round(v, 3)) for k, v in sorted(by.items(), key=lambda kv: -kv[1])[:top]]}


def step_time(mode: str, batch: int = 128, warmup: int = 3, steps: int = 10,
              profile: bool = False) -> dict:
    import torch._functorch.config as fc

    # The flag is read when a graph is compiled (warm-up); restored for the modes after this one.
    with fc.patch(ban_recompute_materialized_backward=False) if mode.endswith("_rc") \
            else contextlib.nullcontext():
        return _step_time(mode, batch, warmup, steps, profile)


def _step_time(mode: str, batch: int, warmup: int, steps: int, profile: bool) -> dict:
    from hot.common import quant

    hot_on = mode.startswith("hot")
    m = _model(mode)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    compiled = mode.endswith(("compile", "compile_ro", "compile_rc"))
    if compiled:
        import torch._dynamo.utils as du

        du.counters.clear()  # the counters are process-wide: count this mode's compiles only
    # HOT layers trace through the operators of hot.nn.autograd: no graph break at a HOT layer.
    fwd = m
    if mode.endswith("compile_ro"):
        # CUDA graphs (mode="reduce-overhead"); graph partitions keep HOT's ops (tagged
        # cudagraph_unsafe: their seeds and step counters live on the host) outside the graphs.
        import torch._inductor.config as ic

        ic.graph_partition = True
        fwd = torch.compile(m, mode="reduce-overhead")
    elif compiled:
        fwd = torch.compile(m)
    xs = [torch.randn(batch, 3, 224, 224, device="cuda") for _ in range(2)]
    ys = [torch.randint(0, 1000, (batch,), device="cuda") for _ in range(2)]

    def step(i):
        if mode.endswith("compile_ro"):
            torch.compiler.cudagraph_mark_step_begin()  # a training step: new graph outputs
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(fwd(xs[i % 2]), ys[i % 2])
        with quant.hash_rng() if mode.startswith("hot_ref") else contextlib.nullcontext():
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    losses = []
    t0 = time.time()
    for i in range(warmup):
        loss = step(i)
        losses.append(float(loss))
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = step(warmup + i)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
        losses.append(float(loss))
    times.sort()
    out = {"mode": mode, "step_ms": times[len(times) // 2], "min_ms": times[0],
           "peak_GiB": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss),
           "losses": [round(v, 4) for v in losses],
           "warmup_s": warm_s}
    if profile:
        out["profile"] = _profile(lambda i: step(warmup + steps + i))
    if hot_on:
        from hot.nn.modules import HOTConv2d, HOTLinear

        from hot.fast import native

        out["hot_layers"] = sum(isinstance(x, (HOTLinear, HOTConv2d)) for x in m.modules())
        # layer backwards that ran as one C++ call so far in this process (hot.fast.native)
        out["native_backward_calls"] = native.CALLS["layer_backward"]
        out["native"] = native.why_off() or "on"
    if compiled:
        try:
            import torch._dynamo.utils as du

            out["graph_breaks"] = int(sum(du.counters["graph_break"].values()))
            out["unique_graphs"] = int(du.counters["stats"].get("unique_graphs", 0))
        except Exception:
            pass
    del m, opt, fwd
    torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="bf16,bf16_compile,hot,hot_compile")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None)
    p.add_argument("--profile", action="store_true",
                   help="also profile 2 steps: GPU busy time and the kernels that take most of it")
    a = p.parse_args(argv)
    res = []
    for mode in a.modes.split(","):
        try:
            r = step_time(mode, steps=a.steps, profile=a.profile)
        except Exception as e:  # reported, never hidden: a mode that fails says why
            r = {"mode": mode, "error": f"{type(e).__name__}: {e}",
                 "trace": traceback.format_exc()[-3000:]}
            torch.cuda.empty_cache()
        print(json.dumps({k: v for k, v in r.items() if k != "trace"}), flush=True)
        res.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
