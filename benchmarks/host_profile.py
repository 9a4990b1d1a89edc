"""Host time of one HOT layer's backward on a GPU, and where it goes (cProfile).

    python benchmarks/host_profile.py [--shape 25216,768,768] [--n 300] [--top 25]

Times ``torch.autograd.grad`` of one HOT linear layer (bf16, paper setting, fast backend) by
wall clock with the GPU queue drained before each call, so the number is the host's time to
enqueue one backward; then profiles the same calls with cProfile and prints the functions with
the most time of their own. Uses only the public API, so it also measures an older checkout
(PYTHONPATH=<checkout>).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="25216,768,768", help="L,O,I")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    import hot

    L, O, I = (int(v) for v in a.shape.split(","))
    lin = torch.nn.Linear(I, O, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = hot.convert(torch.nn.Sequential(lin), hot.HOTConfig(seed=0), backend="fast")[0]
    x = torch.randn(L, I, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    g = torch.randn_like(y)

    def bwd():
        torch.autograd.grad(y, (x, layer.weight), g, retain_graph=True)

    for _ in range(10):
        bwd()
    ts = []
    for _ in range(a.n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        bwd()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    ts.sort()
    print(f"host time of one backward {L}x{O}x{I}: median {1e6 * ts[len(ts) // 2]:.0f} us, "
          f"min {1e6 * ts[0]:.0f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(a.n):
        bwd()
        torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(a.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
