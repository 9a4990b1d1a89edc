"""`hot bench`: the per-layer backward benchmark of the fast backend (hot.bench.backward)."""

from __future__ import annotations

import argparse
import importlib

import torch

from .common import CLIError, emit

NO_GPU_EXIT = 2


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="per-layer backward benchmark (needs a CUDA GPU)",
        description="Run the fast backend's per-layer backward benchmark (hot.bench.backward). "
        "Arguments after `--` are passed to it unchanged. Without a CUDA GPU it prints why and "
        f"exits with status {NO_GPU_EXIT}.")
    p.add_argument("--json", action="store_true", help="JSON output (passed on as --json)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for hot.bench.backward")
    p.set_defaults(func=run)


def run(args) -> int:
    rest = [a for a in args.rest if a != "--"]
    if not torch.cuda.is_available():
        msg = ("hot bench measures the fast (GPU) backend and needs a CUDA GPU; none is visible "
               "here. On CPU, use `hot gbops` for operation counts and `hot memory` for memory.")
        emit(args, {"error": msg, "gpu": False}, msg)
        return NO_GPU_EXIT
    try:
        mod = importlib.import_module("hot.bench.backward")
    except ImportError as e:
        raise CLIError(f"the benchmark module hot.bench.backward is not available ({e}); it "
                       f"ships with the fast backend.") from e
    if not hasattr(mod, "main"):
        raise CLIError("hot.bench.backward has no main(argv) function.")
    return int(mod.main(rest + (["--json"] if args.json else [])) or 0)
