"""`hot bench [layer|step|gpus] [ARGS]`: the benchmarks users run, each a hot.bench module whose
main(argv, usage_error) receives ARGS unchanged. Plain `hot bench [-- ARGS]` is `hot bench
layer`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
from typing import NamedTuple, Optional

import torch

from . import argtypes as T
from .common import CLIError, emit
from .errors import EXIT_ERROR, UsageError, usage_message


class Benchmark(NamedTuple):
    module: str  # hot.bench module: main(argv, usage_error) -> exit status; JSON to --json PATH
    about: str
    device_flag: Optional[str]  # its option that picks the device; None: always a CUDA GPU
    default_device: str  # that option's default ("auto": a GPU where one is visible, else CPU)
    no_gpu_hint: str  # what to do instead when a CUDA GPU is asked for and none is visible


BENCHMARKS = {
    "layer": Benchmark(
        "hot.bench.backward", "one HOT layer's backward against F.linear's (FP32, TF32, BF16), "
        "by stage", None, "cuda",
        "on CPU, use `hot gbops` for operation counts and `hot memory` for memory."),
    "step": Benchmark(
        "hot.bench.e2e", "a ViT-B/16 or Llama training step: HOT against bf16 and float8",
        "--device", "cuda", "pass --device cpu for a smoke run (reference backend)."),
    "gpus": Benchmark(
        "hot.bench.distributed", "DDP and FSDP2 on 1 and 2 GPUs: checks, speed, scaling",
        "--device", "auto", "pass --device cpu (or leave --device auto) for the checks on "
        "gloo processes."),
}
DEFAULT = "layer"  # `hot bench` before it had sub-benchmarks


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="benchmarks: per layer, a training step, several GPUs",
        usage=f"hot bench [--json] [{{{','.join(BENCHMARKS)}}}] [ARGS ...]",
        description="Run one of the benchmarks below; the arguments after its name go to its "
        "main(argv) unchanged (`hot bench step --help` shows its own). Plain `hot bench [-- "
        f"ARGS]` runs `{DEFAULT}`. Asked for a CUDA GPU where none is visible (layer always, "
        f"step by default, gpus with --device cuda), it says so on one line and exits with "
        f"status {EXIT_ERROR}.",
        epilog="benchmarks:\n" + "\n".join(f"  {n:6s} {b.about}\n         ({b.module})"
                                           for n, b in BENCHMARKS.items()))
    p.add_argument("--json", action="store_true",
                   help="print the benchmark's results as one JSON object on stdout (its own "
                        "output goes to stderr)")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="the benchmark's name, then its arguments")
    p.set_defaults(func=run)


def split(rest: list[str]) -> tuple[str, list[str]]:
    """(benchmark name, its arguments) from what follows `hot bench`: a first word that is not
    an option names the benchmark; `--` or an option first means `layer`."""
    if rest and rest[0] == "--":
        return DEFAULT, rest[1:]
    if not rest or rest[0].startswith("-"):
        return DEFAULT, rest
    name, argv = rest[0], rest[1:]
    if name not in BENCHMARKS:
        raise UsageError("hot bench", f"no benchmark {name!r}{T.suggestion(name, BENCHMARKS)}; "
                                      f"choose from {', '.join(BENCHMARKS)}.")
    return name, argv[1:] if argv[:1] == ["--"] else argv


def asked_device(argv: list[str], b: Benchmark) -> str:
    """The device the arguments ask the benchmark for (its last --device, as argparse reads)."""
    device = b.default_device
    for i, a in enumerate(argv):
        if a == b.device_flag and i + 1 < len(argv):
            device = argv[i + 1]
        elif b.device_flag and a.startswith(b.device_flag + "="):
            device = a.split("=", 1)[1]
    return device


def run(args) -> int:
    name, argv = split(args.rest)
    b, prog = BENCHMARKS[name], f"hot bench {name}"
    if args.json and "--json" in argv:
        raise UsageError(prog, "give either `hot bench --json` (results on stdout) or the "
                               "benchmark's own --json PATH, not both.")
    wants_help = "-h" in argv or "--help" in argv  # its help needs no GPU
    if (not wants_help and asked_device(argv, b).startswith("cuda")
            and not torch.cuda.is_available()):
        # Like every other error: one line on stderr, the documented JSON keys, status 2.
        raise CLIError(f"the {name} benchmark runs on a CUDA GPU and none is visible here; "
                       f"{b.no_gpu_hint}")
    try:
        main = importlib.import_module(b.module).main
    except (ImportError, AttributeError) as e:
        raise CLIError(f"the benchmark module {b.module} cannot be loaded ({e}); reinstall hot "
                       f"with the extras of docs/cli.md.") from e
    if not args.json:
        return call(main, argv, prog)
    # The benchmarks write their JSON to a path (--json PATH) and print tables and progress;
    # keep stdout for one JSON object by sending the rest to stderr.
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "bench.json")
        with contextlib.redirect_stdout(sys.stderr):
            rc = call(main, argv + ["--json", path], prog)
        if rc != 0 or not os.path.exists(path):
            raise CLIError(f"{b.module} exited with status {rc} and wrote no results.")
        with open(path) as f:
            result = json.load(f)
    # `step` writes a list of records, one per mode; the others one object.
    emit(args, result if isinstance(result, dict) else {"records": result}, "")
    return 0


def call(main, argv: list[str], prog: str) -> int:
    """main(argv) as an exit status; its --help (argparse's SystemExit) ends it with status 0.
    A bad argument is a UsageError like every other (one line on stderr, status 2): the
    benchmark's parser (hot.bench.argparser) raises what usage_error makes of its message."""

    def usage_error(message: str) -> UsageError:
        return UsageError(prog, usage_message(prog, message))

    try:
        return int(main(argv, usage_error=usage_error) or 0)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_ERROR)
