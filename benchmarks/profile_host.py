"""Where the host time of one HOT layer backward goes (fast backend, GPU).

A tiny layer (GPU work negligible) is run many times: its wall time per backward is the host
overhead that every layer pays. Reports that next to a bare Triton launch and a bare torch op,
then a cProfile of the tiny layer's backward (top functions by own time).

    python benchmarks/profile_host.py [--shape 256,64,64] [--n 200]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch


def _wall_us(fn, n: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    t.sort()
    return t[len(t) // 2] * 1e6


def bare_triton_launch_us(n: int) -> float:
    import triton
    import triton.language as tl

    @triton.jit
    def k(p, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, B: tl.constexpr):
        tl.store(p + tl.arange(0, B), tl.zeros((B,), tl.float32))

    x = torch.empty(16, device="cuda")
    return _wall_us(lambda: k[(1,)](x, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, B=16), n)


def main() -> None:
    import hot

    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="256,64,64", help="tokens,in,out of the tiny layer")
    p.add_argument("--n", type=int, default=200)
    a = p.parse_args()
    L, i, o = (int(v) for v in a.shape.split(","))
    x = torch.randn(L, i, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    m = hot.convert(torch.nn.Sequential(torch.nn.Linear(i, o)), hot.HOTConfig(seed=0),
                    backend="fast").cuda().to(torch.bfloat16)
    y = m(x)
    gy = torch.randn_like(y)

    def fwd_bwd():
        m(x).backward(gy)

    def fwd():
        with torch.no_grad():
            m(x)

    ones = torch.ones(16, device="cuda")
    print(f"bare torch op (add): {_wall_us(lambda: ones.add(1), a.n):.1f} us")
    print(f"bare Triton launch (11 args): {bare_triton_launch_us(a.n):.1f} us")
    print(f"HOT layer forward (no grad) {a.shape}: {_wall_us(fwd, a.n):.1f} us")
    print(f"HOT layer forward+backward {a.shape}: {_wall_us(fwd_bwd, a.n):.1f} us")
    lin = torch.nn.Linear(i, o).cuda().to(torch.bfloat16)
    print(f"nn.Linear forward+backward {a.shape}: {_wall_us(lambda: lin(x).backward(gy), a.n):.1f} us")
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(a.n):
        fwd_bwd()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    print(f"cProfile of {a.n} forward+backward calls (tottime):")
    print("\n".join(ln[:160] for ln in s.getvalue().splitlines()[4:]))
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(30)
    print("(cumtime):")
    print("\n".join(ln[:160] for ln in s.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
