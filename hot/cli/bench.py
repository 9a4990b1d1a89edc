"""`hot bench`: the per-layer backward benchmark of the fast backend (hot.bench.backward)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile

import torch

from .common import CLIError, emit

NO_GPU_EXIT = 2


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="per-layer backward benchmark (needs a CUDA GPU)",
        description="Run the fast backend's per-layer backward benchmark (hot.bench.backward). "
        "Arguments after `--` are passed to it unchanged. Without a CUDA GPU it prints why and "
        f"exits with status {NO_GPU_EXIT}.")
    p.add_argument("--json", action="store_true",
                   help="print the benchmark's results as one JSON object on stdout")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for hot.bench.backward")
    p.set_defaults(func=run)


def run(args) -> int:
    rest = [a for a in args.rest if a != "--"]
    if not torch.cuda.is_available():
        # Like every other error: one line on stderr, the documented JSON keys, status 2.
        raise CLIError("hot bench measures the fast (GPU) backend and needs a CUDA GPU; none is "
                       "visible here. On CPU, use `hot gbops` for operation counts and `hot "
                       "memory` for memory.")
    try:
        mod = importlib.import_module("hot.bench.backward")
    except ImportError as e:
        raise CLIError(f"the benchmark module hot.bench.backward is not available ({e}); it "
                       f"ships with the fast backend.") from e
    if not hasattr(mod, "main"):
        raise CLIError("hot.bench.backward has no main(argv) function.")
    if not args.json:
        return int(mod.main(rest) or 0)
    # The benchmark writes its JSON to a path (--json PATH) and prints a Markdown table; keep
    # stdout for one JSON object by sending the table to stderr.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        with contextlib.redirect_stdout(sys.stderr):
            rc = int(mod.main(rest + ["--json", path]) or 0)
        if rc != 0 or not os.path.exists(path):
            raise CLIError(f"hot.bench.backward exited with status {rc} and wrote no results.")
        with open(path) as f:
            emit(args, json.load(f), "")
    return 0
