"""Where a HOT layer backward's time goes on the GPU: its kernels, their durations, and the gaps.

The per-layer benchmark (python -m hot.bench.backward) times the whole backward and each stage
alone; when the total exceeds the stages' sum, this says whether the GPU ran extra kernels or sat
idle waiting for the host.

    python benchmarks/layer_trace.py [--shapes vitb_fc2,vitb_qkv] [--n 10]

For each layer: the median time of one backward (CUDA events), the GPU busy time per backward
(kernel durations from torch.profiler, summed), and the kernels of one backward with durations.
"""

from __future__ import annotations

import argparse

import torch

from hot.bench.backward import SHAPES


def trace(name: str, L: int, O: int, I: int, n: int) -> None:
    import hot
    from hot.bench.timing import bench
    from hot.fast import native

    lin = torch.nn.Linear(I, O, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = hot.convert(torch.nn.Sequential(lin), hot.HOTConfig(seed=0), backend="fast")[0]
    x = torch.randn(L, I, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    g = torch.randn_like(y)

    def bwd():
        torch.autograd.grad(y, (x, layer.weight), g, retain_graph=True)

    for _ in range(5):
        bwd()
    before = native.CALLS["layer_backward"]
    ms = bench(bwd)
    used = native.CALLS["layer_backward"] - before
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            bwd()
        torch.cuda.synchronize()
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.device_time for e in kern) / n / 1e3
    print(f"{name} {L}x{O}x{I}: backward {ms:.3f} ms, GPU busy {busy:.3f} ms per backward, "
          f"{len(kern) / n:.1f} kernels per backward, native calls in timing {used} "
          f"({native.why_off() or 'native on'})")
    per = len(kern) // n
    for e in kern[-per:]:
        print(f"    {e.device_time / 1e3:7.4f} ms  {e.name[:90]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="vitb_qkv,vitb_proj,vitb_fc1,vitb_fc2")
    p.add_argument("--n", type=int, default=10)
    a = p.parse_args(argv)
    table = {s[0]: s for grp in SHAPES.values() for s in grp}
    for s in a.shapes.split(","):
        trace(*table[s], a.n)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
