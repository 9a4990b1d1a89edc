"""Where the CPU time of one demo training step goes (reference backend).

Builds the demo's TinyViT (the sizes of ``hot.cli.demo.DEFAULTS`` unless overridden), trains
on random Fashion-MNIST-shaped batches with AdamW, and reports the median step time of FP32 and
HOT, then a torch.profiler table of HOT steps (ops by self CPU time) and optionally a cProfile.

    python benchmarks/profile_cpu_step.py [--steps 20] [--dim 64 --depth 4] [--cprofile]

The machine is shared and noisy: the load average is printed next to every timing.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats

import torch
import torch.nn.functional as F

import hot
from hot.bench.timing import wall_ms
from hot.cli.demo import DEFAULTS
from hot.models import build_model


def _model(method: str, a):
    torch.manual_seed(0)
    m = build_model("tiny-vit", classes=10, input_shape=(1, 28, 28), vit_dim=a.dim,
                    vit_depth=a.depth, vit_heads=4, vit_mlp=2 * a.dim, vit_patch=a.patch).model
    if method == "hot":
        hot.convert(m, hot.HOTConfig(), convert_head=True, backend="reference")
    return m


def _step_fn(m, a):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(a.batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g)

    def step():
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dim", type=int, default=DEFAULTS["dim"])
    p.add_argument("--depth", type=int, default=DEFAULTS["depth"])
    p.add_argument("--patch", type=int, default=DEFAULTS["patch"])
    p.add_argument("--batch", type=int, default=DEFAULTS["batch_size"])
    p.add_argument("--methods", default="fp32,hot")
    p.add_argument("--profile", action="store_true", help="torch.profiler table of HOT steps")
    p.add_argument("--cprofile", action="store_true", help="cProfile of HOT steps")
    p.add_argument("--rows", type=int, default=30)
    a = p.parse_args()
    print(f"threads {torch.get_num_threads()}, load {os.getloadavg()}")
    steps = {}
    for method in a.methods.split(","):
        steps[method] = _step_fn(_model(method, a), a)
        med, t = wall_ms(steps[method], a.steps)
        print(f"{method}: median {med:.1f} ms/step (min {min(t):.1f}, max {max(t):.1f}) "
              f"load {os.getloadavg()[0]:.2f}")
    step = steps.get("hot")
    if step is None:
        return
    if a.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.rows))
    if a.cprofile:
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(5):
            step()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(a.rows)
        print(s.getvalue())


if __name__ == "__main__":
    main()
