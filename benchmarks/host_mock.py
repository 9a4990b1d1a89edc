"""Host time of HOT's layer machinery per layer and step, on the CPU, with the backend's kernels
mocked out: what a HOT layer costs the host beside its kernels (custom-op dispatch, autograd
wiring, plans, seeds, LQS, the step counter), eager and under torch.compile.

A mock backend named "fast" replaces the real one in this process: its operations return empty
tensors of the right shapes and its one-call backward returns empty gradients, so the layers'
Python and torch's dispatch are all that run besides a tiny F.linear. A stack of ``--layers`` HOT
linear layers (ReLU between them) against the same stack of nn.Linear, forward + backward, no
optimizer: (HOT step - plain step) / layers is HOT's host cost per layer and step.

    python benchmarks/host_mock.py [--layers 24] [--steps 300] [--modes eager,compile]
                                   [--cprofile compile]

The machine is shared and noisy: medians of many steps, and the load average is printed.
"""
import argparse
import cProfile
import io
import os
import pstats

import torch
import torch.nn as nn

import hot
from hot.bench.timing import wall_ms
from hot.common import backend as B
from hot.common import ops


def _hq(x, a):
    return ops.hq_fake(x, a)


def _hla(x, a):
    return ops.hla_fake(x, a)


def _gemm(a, b, sa, sb, dtype):
    return ops.int_gemm_fake(a, b, dtype)


def _layer_backward(gy, wt, x_codes, hq, hla, hq_w, gx_dtype, gw_dtype, need_gb):
    gb = torch.empty(gy.shape[1], dtype=gy.dtype) if need_gb else None
    return (torch.empty((gy.shape[0], wt.shape[0]), dtype=gx_dtype),
            torch.empty((gy.shape[1], wt.shape[0]), dtype=gw_dtype), gb)


def install_mock() -> None:
    """Register a mock backend named "fast" whose operations return empty outputs."""
    for name, fn in (("hq_quantize", _hq), ("hla_quantize", _hla), ("int_gemm_nt", _gemm),
                     ("layer_backward", _layer_backward)):
        ops.register(name, "fast", fn)
    B.register_backend(B.Backend("fast", lambda device: None))


def _stack(n: int, width: int, use_hot: bool) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(n):
        layers += [nn.Linear(width, width), nn.ReLU()]
    m = nn.Sequential(*layers)
    if use_hot:
        hot.convert(m, hot.HOTConfig(seed=0), convert_head=True, backend="fast")
    return m


def _step_ms(fwd, x, steps: int) -> float:
    # 20 warm-up steps: the first compiled ones compile
    return wall_ms(lambda: fwd(x).sum().backward(), steps, warmup=20)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--cprofile", default=None, help="a mode to profile with cProfile")
    a = p.parse_args()
    install_mock()
    torch.set_num_threads(1)
    x = torch.randn(a.tokens, a.width, requires_grad=True)
    print(f"torch {torch.__version__}, {a.layers} layers, load {os.getloadavg()[0]:.2f}")
    for mode in a.modes.split(","):
        res = {}
        for use_hot in (False, True):
            torch._dynamo.reset()
            m = _stack(a.layers, a.width, use_hot)
            fwd = torch.compile(m) if mode == "compile" else m
            res[use_hot] = _step_ms(fwd, x, a.steps)
            if use_hot and a.cprofile == mode:
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(50):
                    fwd(x).sum().backward()
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
                print(s.getvalue())
        per = (res[True] - res[False]) / a.layers * 1e3
        print(f"{mode}: plain {res[False]:.3f} ms, HOT {res[True]:.3f} ms per step; "
              f"HOT host cost {per:.1f} us per layer and step (load {os.getloadavg()[0]:.2f})",
              flush=True)


if __name__ == "__main__":
    main()
