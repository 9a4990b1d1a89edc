"""The benchmark's options (one frozen dataclass) and the command line that fills them."""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..argparser import BenchParser, UsageErrorFactory
from .workloads import LLAMA_CPU, LLAMA_GPU, VIT_CPU, VIT_GPU, WORKLOADS, LlamaSize, ViTSize

METHODS = ("bf16", "hot")
WRAPPERS = ("ddp", "fsdp2")
CHECKS = ("exact", "paper", "lqs", "checkpoint", "zero_gy", "nan_gy")


class OptionsError(ValueError):
    """A bad option; the message names the flag, the value and the fix."""


@dataclass(frozen=True)
class Options:
    """Everything one run does. ``device`` 'cuda' runs one process per GPU over NCCL, with bf16
    autocast (float32 for the exact check), fused AdamW and the fast backend; 'cpu' runs gloo
    processes in float32 with AdamW and the reference backend."""

    device: str
    workloads: tuple[str, ...]
    methods: tuple[str, ...]
    wrappers: tuple[str, ...]
    worlds: tuple[int, ...]
    checks: tuple[str, ...]
    speed: bool
    vit: ViTSize
    llama: LlamaSize
    steps: int  # training steps of the paper-setting curves
    exact_steps: int  # training steps of the exact-gradient curves
    seeds: tuple[int, ...]  # HOTConfig seeds of the 1-rank curves; 2-rank curves use seeds[0]
    warmup: int
    timed: int
    vit_lr: float
    llama_lr: float
    llama_batches: int
    init_seed: int
    data_root: Optional[str]
    pg_timeout: float
    phase_timeout: float
    hang_timeout: float
    budget: float
    threads: int
    json: str

    @property
    def backend(self) -> str:
        return "fast" if self.device == "cuda" else "reference"

    def lr(self, workload: str) -> float:
        return self.vit_lr if workload == "vit" else self.llama_lr

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _csv(flag: str, value: str, allowed: tuple, cast=str) -> tuple:
    try:
        items = tuple(cast(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise OptionsError(f"{flag}={value!r} is not a comma list of {cast.__name__}s.") from None
    bad = [v for v in items if allowed and v not in allowed]
    if bad or not items:
        raise OptionsError(f"{flag}={value!r}: {bad[0] if bad else 'empty'} is not one of "
                           f"{', '.join(map(str, allowed))}; pass a comma list of those.")
    return items


def parser(usage_error: Optional[UsageErrorFactory] = None) -> argparse.ArgumentParser:
    p = BenchParser(
        prog="python -m hot.bench.distributed", usage_error=usage_error,
        description="HOT under DDP and FSDP2 on 1 and 2 GPUs (NCCL; gloo processes on CPU): "
        "correctness checks, then step time, throughput, scaling and peak memory.")
    a = p.add_argument
    a("--device", choices=("auto", "cuda", "cpu"), default="auto",
      help="auto: cuda when a GPU is visible, else cpu")
    a("--workloads", default=",".join(WORKLOADS), help="comma list of: vit, llama")
    a("--methods", default=",".join(METHODS), help="speed rows: bf16 (no HOT), hot")
    a("--wrappers", default=",".join(WRAPPERS), help="comma list of: ddp, fsdp2")
    a("--worlds", default="1,2", help="world sizes (1 = rank 0 alone, in its own processes)")
    a("--checks", default=",".join(CHECKS), help="comma list of: " + ", ".join(CHECKS)
      + "; 'none' for none")
    a("--speed", action=argparse.BooleanOptionalAction, default=None,
      help="measure step time and memory (default: on GPU only; on CPU the times are wall "
      "clock of tiny models, no benchmark)")
    for f, d in (("dim", "width"), ("depth", "blocks"), ("heads", "attention heads"),
                 ("mlp", "MLP width"), ("patch", "patch size"), ("batch", "images per GPU")):
        a(f"--vit-{f}", type=int, default=None, help=f"TinyViT {d}")
    for f, d in (("hidden", "hidden size"), ("layers", "decoder layers"),
                 ("heads", "attention heads"), ("ffn", "MLP width"), ("vocab", "vocabulary"),
                 ("seq", "sequence length"), ("batch", "sequences per GPU")):
        a(f"--llama-{f}", type=int, default=None, help=f"Llama {d}")
    a("--steps", type=int, default=20, help="steps of the paper-setting loss curves")
    a("--exact-steps", type=int, default=5, help="steps of the exact-gradient loss curves")
    a("--seeds", default="0,1,2", help="HOT seeds of the 1-rank curves (the seed noise)")
    a("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    a("--timed", type=int, default=10, help="timed steps (the median is reported)")
    a("--vit-lr", type=float, default=1e-3)
    a("--llama-lr", type=float, default=3e-4)
    a("--llama-batches", type=int, default=2, help="distinct random-token global batches")
    a("--init-seed", type=int, default=0, help="torch seed of every model's initial weights")
    a("--data-root", default=None, help="folder of the Fashion-MNIST IDX .gz files")
    a("--pg-timeout", type=float, default=120.0, help="init_process_group timeout (s)")
    a("--phase-timeout", type=float, default=150.0, help="wall-clock limit of one phase (s)")
    a("--hang-timeout", type=float, default=30.0,
      help="wall-clock limit of the step with a zero or NaN g_y on rank 1 (s)")
    a("--budget", type=float, default=390.0,
      help="wall-clock limit of the whole run (s); phases that no longer fit are skipped")
    a("--threads", type=int, default=None,
      help="OMP/torch threads per process (default: CPU cores / processes)")
    a("--json", default=None,
      help="results file (default: hot-distributed-<date>-<time>.json); never overwritten")
    return p


def _positive(flag: str, v, allow_zero: bool = False):
    if v is not None and (v < 0 or (v == 0 and not allow_zero)):
        raise OptionsError(f"{flag}={v} must be {'>= 0' if allow_zero else '> 0'}.")
    return v


def _sized(prefix: str, base, a):
    """``base`` (a size dataclass) with the fields given as --<prefix>-<field> flags."""
    given = {f.name: getattr(a, f"{prefix}_{f.name}") for f in dataclasses.fields(base)}
    return dataclasses.replace(base, **{k: _positive(f"--{prefix}-{k}", v)
                                        for k, v in given.items() if v is not None})


def from_args(argv=None, usage_error: Optional[UsageErrorFactory] = None) -> Options:
    """Options from the command line; OptionsError names a bad flag and its fix (argparse's own
    errors: see hot.bench.argparser)."""
    a = parser(usage_error).parse_args(argv)
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    elif device == "cuda" and not torch.cuda.is_available():
        raise OptionsError("--device cuda: no CUDA GPU is visible; use --device cpu.")
    vit0, llama0 = (VIT_GPU, LLAMA_GPU) if device == "cuda" else (VIT_CPU, LLAMA_CPU)
    vit, llama = _sized("vit", vit0, a), _sized("llama", llama0, a)
    if vit.dim % vit.heads or 28 % vit.patch:
        raise OptionsError(f"--vit-dim {vit.dim} / --vit-heads {vit.heads} / --vit-patch "
                           f"{vit.patch}: heads must divide dim and patch must divide 28.")
    if llama.hidden % llama.heads:
        raise OptionsError(f"--llama-heads {llama.heads} must divide --llama-hidden "
                           f"{llama.hidden}.")
    checks = () if a.checks == "none" else _csv("--checks", a.checks, CHECKS)
    worlds = _csv("--worlds", a.worlds, (1, 2), int)
    for flag in ("steps", "exact_steps", "timed", "llama_batches"):
        _positive(f"--{flag.replace('_', '-')}", getattr(a, flag))
    _positive("--warmup", a.warmup, allow_zero=True)
    for flag in ("pg_timeout", "phase_timeout", "hang_timeout", "budget"):
        _positive(f"--{flag.replace('_', '-')}", getattr(a, flag))
    _positive("--threads", a.threads)
    path = a.json or time.strftime("hot-distributed-%Y%m%d-%H%M%S.json")
    if os.path.exists(path):
        raise OptionsError(f"--json {path}: the file exists and is never overwritten; pass a "
                           f"new path.")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise OptionsError(f"--json {path}: cannot write into {folder}; pass a path in an "
                           f"existing, writable folder.")
    procs = max(worlds)
    return Options(
        device=device, workloads=_csv("--workloads", a.workloads, WORKLOADS),
        methods=_csv("--methods", a.methods, METHODS),
        wrappers=_csv("--wrappers", a.wrappers, WRAPPERS), worlds=tuple(sorted(set(worlds))),
        checks=checks, speed=(device == "cuda") if a.speed is None else a.speed,
        vit=vit, llama=llama, steps=a.steps, exact_steps=a.exact_steps,
        seeds=_csv("--seeds", a.seeds, (), int), warmup=a.warmup, timed=a.timed,
        vit_lr=a.vit_lr, llama_lr=a.llama_lr, llama_batches=a.llama_batches,
        init_seed=a.init_seed, data_root=a.data_root, pg_timeout=a.pg_timeout,
        phase_timeout=a.phase_timeout, hang_timeout=a.hang_timeout, budget=a.budget,
        threads=a.threads or max(1, _cores() // procs), json=path)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
