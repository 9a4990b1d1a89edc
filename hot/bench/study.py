"""The quality study: which HOT settings train as well as FP32, and what each keeps of HLA's
savings. Every cell (task x setting x seed) is one ``hot train`` process with its own output
folder; cells run in parallel (several processes share one GPU), a finished cell is never rerun
and an interrupted one resumes from its checkpoint.

    python -m hot.bench.study run --out DIR [--tasks tinyvit-fmnist] [--settings fp32,paper,...]
                                  [--seeds 0,1,2] [--workers 8] [--data-root D] [--device cuda]
                                  [--epochs N] [--train-size N] [--time-limit S]
    python -m hot.bench.study table --out DIR      # table of what has finished, JSON and markdown
    python -m hot.bench.study merge A.json B.json [--md T.md] [--png P.png]  # several runs

The metric of a task is its last epoch's test accuracy (classification) or validation
perplexity (the language-model task). Each setting is compared with FP32 by the gap paired by
seed: the mean over seeds of (setting - FP32) on the same seed (same initial weights and data
order), with its standard error sd / sqrt(n). "HLA kept" is the fraction of the paper setting's
saving in g_W multiply-adds that the setting keeps: HLA at rank r does r/16 of the exact g_W
work, so a run saves (1 - r/16) of it on its HOT steps, against the paper's (1 - 8/16) on all of
them; exact warm-up steps save nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from .. import recipes


@dataclass(frozen=True)
class Task:
    """A training task: ``hot train`` flags and the metric that its metrics.json reports."""

    name: str
    flags: tuple[str, ...]
    metric: str  # "test_acc" (higher is better) or "val_ppl" (lower is better)
    epochs: int
    steps_per_epoch: Optional[int] = None  # to place warm-ups a whole number of epochs long


@dataclass(frozen=True)
class Setting:
    """A training method and HOT configuration, as ``hot train`` flags."""

    name: str
    flags: tuple[str, ...]
    rank: Optional[int] = None  # HLA rank of the HOT steps; None: no HOT (fp32, bf16)
    warmup_epochs: int = 0      # epochs of exact backward before HOT (--exact-steps)
    cooldown_epochs: int = 0    # epochs of exact backward after HOT (--exact-from)
    int8_epochs: int = 0        # epochs with g_x at 8 bits after the warm-up (--int8-steps)
    per_layer: bool = False     # ranks differ by layer: HLA kept from the run's hla_rank_share
    warmup_share: float = 0.0   # this share of the run's steps exact first (--exact-steps)
    about: str = ""
    # Another setting this one is also compared with, paired by seed (the one it changes one
    # thing of): its row gets pair / pair_gap / pair_gap_se, and the table a line.
    pair: Optional[str] = None


def recipe_setting(method: str, name: Optional[str] = None) -> Setting:
    """The setting that trains recipe ``method`` as registered (``hot train --method METHOD``),
    called ``name`` (default: the recipe's name); its rank and description are the recipe's."""
    r = recipes.get(method)
    return Setting(name or r.name, ("--method", r.name), rank=r.rank, about=r.summary)


TASKS = {t.name: t for t in (
    # The setting: TinyViT dim 128, depth 6 from scratch, full Fashion-MNIST, 5 epochs
    # of 469 steps (60,000 images, batch 128).
    Task("tinyvit-fmnist", ("--model", "tiny-vit", "--dataset", "fashion-mnist"), "test_acc",
         5, steps_per_epoch=469),
    # The paper's Table-4 CNN and hybrid: timm models from scratch on the same data (ResNet-18
    # takes 28x28 as it is; EfficientFormer-L1's attention tables need 224x224).
    Task("resnet18-fmnist", ("--model", "resnet18", "--dataset", "fashion-mnist"), "test_acc",
         5, steps_per_epoch=469),
    Task("efficientformer-fmnist", ("--model", "efficientformer_l1", "--dataset", "fashion-mnist",
                                    "--image-size", "224"), "test_acc", 5, steps_per_epoch=469),
    # 10,202 training snippets in batches of 128: 80 steps per epoch.
    Task("minilm-rt", ("--model", "minilm", "--dataset", "rotten-tomatoes"), "test_acc", 2,
         steps_per_epoch=80),
    # LoRA (rank 8) on MiniLM: which layers run HOT is the setting (lora_adapters, lora_both).
    Task("minilm-rt-lora", ("--model", "minilm", "--dataset", "rotten-tomatoes", "--lora-r", "8",
                            "--lr", "5e-4"), "test_acc", 2),
    # 10,202 training snippets in batches of 128: 80 steps per epoch.
    Task("lm", ("--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm"), "val_ppl", 2,
         steps_per_epoch=80),
    # A few seconds on a CPU: the harness's own test.
    Task("smoke", ("--model", "tiny-vit", "--dataset", "mnist-5k", "--train-size", "256",
                   "--test-size", "128", "--vit-dim", "32", "--vit-depth", "1"), "test_acc", 1,
         steps_per_epoch=2),
)}

# The flags that pin a "hot" setting to the paper's quantizers (HOTConfig.paper()): the
# settings below that vary the paper's setting start from it, not from HOTConfig().
PAPER = ("--hla-selection", "lowpass", "--hq-bits", "4")

SETTINGS = {s.name: s for s in (
    recipe_setting("fp32"),
    recipe_setting("bf16"),
    recipe_setting("paper"),
    # HOTConfig(): the paper's method with HLA's rows drawn per block (unbiased g_W) and HQ's
    # width following the GPU (8 bits on Hopper and CPUs, 4 on Ampere / Ada)
    Setting("hot", ("--method", "hot"), rank=8,
            about="HOTConfig(): unbiased HLA (stratified rows), HQ width auto"),
    # HOTConfig.quantized(): the same backward as "hot" with the INT8 HQ forward
    dataclasses.replace(recipe_setting("hot-q"), pair="hot"),
    # hot-q with HLAConfig(share="siblings"): one pass over an input several layers read
    Setting("hot-q_share", ("--method", "hot-q", "--hla-share", "siblings"), rank=8,
            pair="hot-q", about="HOTConfig.quantized() with HLAConfig(share='siblings')"),
    # HLAConfig(share="siblings"): the same as "hot" with sibling layers' x codes on one seed
    Setting("hot_share", ("--method", "hot", "--hla-share", "siblings"), rank=8, pair="hot",
            about="HOTConfig() with HLAConfig(share='siblings'): siblings' x codes shared"),
    Setting("strat_hq4", ("--method", "hot", "--hq-bits", "4"), rank=8,
            about="unbiased HLA (stratified rows) with the paper's 4-bit HQ"),
    Setting("strat_hq8", ("--method", "hot", "--hq-bits", "8"), rank=8,
            about="unbiased HLA (stratified rows) with 8-bit HQ (HOTConfig() on Hopper)"),
    Setting("strat_only", ("--method", "hot", "--hq-bits", "none", "--hla-bits", "none"),
            rank=8, about="the stratified rank-8 estimator alone, unquantized; g_x exact"),
    Setting("strat_head16", ("--method", "hot", "--hla-full-rank", "head,classifier"), rank=8,
            per_layer=True, about="HOTConfig() with the output head's g_W at rank 16"),
    Setting("strat_attn16", ("--method", "hot", "--hla-full-rank", "attn,attention"), rank=8,
            per_layer=True, about="HOTConfig() with the attention layers' g_W at rank 16"),
    Setting("rank16", ("--method", "hot", *PAPER, "--hla-rank", "16"), rank=16,
            about="HQ and INT8 g_W, no low rank: what quantization alone costs"),
    Setting("rank4", ("--method", "hot", *PAPER, "--hla-rank", "4"), rank=4,
            about="HLA rank 4: more savings than the paper"),
    Setting("lp_l1", ("--method", "hot", *PAPER, "--hla-selection", "lp_l1"), rank=8,
            about="the paper's LP_L1 row selection instead of the 1-D low-pass"),
    Setting("warmup1", ("--method", "hot", *PAPER), rank=8, warmup_epochs=1,
            about="the paper setting after one epoch of exact backward"),
    Setting("warmup2", ("--method", "hot", *PAPER), rank=8, warmup_epochs=2,
            about="the paper setting after two epochs of exact backward"),
    Setting("cooldown1", ("--method", "hot", *PAPER), rank=8, cooldown_epochs=1,
            about="the paper setting, then one epoch of exact backward at the end"),
    Setting("cooldown2", ("--method", "hot", *PAPER), rank=8, cooldown_epochs=2,
            about="the paper setting, then two epochs of exact backward at the end"),
    Setting("warmup1_cooldown1", ("--method", "hot", *PAPER), rank=8, warmup_epochs=1,
            cooldown_epochs=1, about="one exact epoch first, the paper setting, one exact last"),
    recipe_setting("hlq"),
    Setting("hlq_abc", ("--method", "hot", *PAPER, "--gy-scale", "token", "--abc", "save"), rank=8,
            about="HLQ + ABC (the paper's Table 1 middle row): INT8 codes saved, no LQS"),
    Setting("rank2", ("--method", "hot", *PAPER, "--hla-rank", "2"), rank=2,
            about="HLA rank 2 (the paper's Table 2)"),
    Setting("rank1", ("--method", "hot", *PAPER, "--hla-rank", "1"), rank=1,
            about="HLA rank 1 (the paper's Table 2)"),
    # HLA off (rank 16, quantization kept) on some layers: the share kept is the run's own
    # (metrics.json hla_rank_share), from the layers' weight sizes.
    Setting("hla_mlp", ("--method", "hot", *PAPER, "--hla-full-rank", "attn,attention"), rank=8,
            per_layer=True,
            about="HLA rank 8 on the MLP layers only; attention layers at rank 16"),
    Setting("hla_attn", ("--method", "hot", *PAPER, "--hla-full-rank", "fc1,fc2"), rank=8,
            per_layer=True, about="HLA rank 8 on the attention layers only; MLP at rank 16"),
    Setting("recommended", ("--method", "hot", *PAPER), rank=8, warmup_share=0.4,
            about="HOTConfig.recommended(exact_steps=0.4 of the run's steps)"),
    Setting("hq8_hla_mlp", ("--method", "hot", *PAPER, "--hq-bits", "8", "--hla-full-rank",
                            "attn,attention"),
            rank=8, per_layer=True, about="hla_mlp with HQ at 8 bits"),
    Setting("hla_mlp_warmup1", ("--method", "hot", *PAPER, "--hla-full-rank", "attn,attention"), rank=8,
            per_layer=True, warmup_epochs=1,
            about="hla_mlp after one epoch of exact backward"),
    # Which LoRA layers run HOT (the paper's Table 3; tasks with --lora-r).
    Setting("lora_adapters", ("--method", "hot", *PAPER, "--lora-hot", "adapters"), rank=8,
            about="HOT on the trained LoRA factors only (frozen base layers exact)"),
    Setting("lora_both", ("--method", "hot", *PAPER, "--lora-hot", "both"), rank=8,
            about="HOT on the frozen base layers and the LoRA factors"),
    recipe_setting("int4"),
    recipe_setting("luq"),
    recipe_setting("lbp-wht", "lbp_wht"),
    Setting("int8_2", ("--method", "hot", *PAPER), rank=8, int8_epochs=2,
            about="the paper's pre-training schedule: g_x at 8 bits for 2 epochs, then 4"),
    # Where the gap comes from: each part of HOT alone.
    Setting("hq_only", ("--method", "hot", *PAPER, "--hla-rank", "16", "--hla-bits", "none"), rank=16,
            about="HQ 4-bit g_x only; g_W exact"),
    Setting("hla_only", ("--method", "hot", *PAPER, "--hq-bits", "none"), rank=8,
            about="HLA rank 8 in INT8 only; g_x exact"),
    Setting("lowrank_only", ("--method", "hot", *PAPER, "--hq-bits", "none", "--hla-bits", "none"),
            rank=8, about="HLA's rank-8 projection only, unquantized; g_x exact"),
    Setting("rank16_token", ("--method", "hot", *PAPER, "--hla-rank", "16", "--gy-scale", "token"),
            rank=16, about="as rank16 with per-token g_y scales forced (no LQS)"),
    Setting("delayed", ("--method", "hot", *PAPER, "--hla-amax", "delayed"), rank=8,
            about="as paper, HLA's channel scales from the previous pass's absmax (one read)"),
    # HQ's bits change g_x only: HLA's saving on g_W stays whole.
    Setting("hq8", ("--method", "hot", *PAPER, "--hq-bits", "8"), rank=8,
            about="HQ at 8 bits (INT8 g_x), HLA as in the paper"),
    Setting("hq8_rank16", ("--method", "hot", *PAPER, "--hq-bits", "8", "--hla-rank", "16"), rank=16,
            about="HQ at 8 bits, no low rank: what INT8 quantization alone costs"),
    Setting("hq8_warmup1", ("--method", "hot", *PAPER, "--hq-bits", "8"), rank=8, warmup_epochs=1,
            about="HQ at 8 bits after one epoch of exact backward"),
    Setting("hq8_warmup2", ("--method", "hot", *PAPER, "--hq-bits", "8"), rank=8, warmup_epochs=2,
            about="HQ at 8 bits after two epochs of exact backward"),
)}

DEFAULT_SETTINGS = "fp32,bf16,paper,rank16,rank4,warmup1"


def all_settings() -> dict:
    """SETTINGS, and every recipe registered now (hot.recipes) that no setting names, as
    trained by ``hot train --method`` (recipe_setting): a new recipe is a setting unedited."""
    return {**{n: recipe_setting(n) for n in recipes.names()}, **SETTINGS}


class StudyError(ValueError):
    """Bad study arguments: says which and what to give."""


def parse_names(flag: str, text: str, known: dict) -> list:
    """The values of ``known`` that the comma-separated ``text`` names, in its order, each once
    (a name given twice would run twice into one folder); StudyError naming ``flag``, the
    unknown or repeated name and the choices."""
    out, seen = [], set()
    for n in (v.strip() for v in text.split(",") if v.strip()):
        if n not in known:
            raise StudyError(f"{flag}: unknown {n!r}{suggest(n, known)}; choose from "
                             f"{', '.join(known)}.")
        if n in seen:  # it would run twice into one folder
            raise StudyError(f"{flag} {text}: {n!r} is listed twice; give each once.")
        seen.add(n)
        out.append(known[n])
    if not out:
        raise StudyError(f"{flag} is empty; give a comma-separated list from {', '.join(known)}.")
    return out


def suggest(name: str, known) -> str:
    """' (did you mean 'x'?)' for the closest of ``known`` names, or ''."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_seeds(text: str) -> list[int]:
    """Distinct integer seeds from comma-separated ``text``; StudyError otherwise."""
    try:
        seeds = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise StudyError(f"--seeds {text!r}: give integers separated by commas, e.g. 0,1,2.")
    if not seeds or len(set(seeds)) != len(seeds):
        raise StudyError(f"--seeds {text!r}: give distinct integers, e.g. 0,1,2.")
    return seeds


@dataclass(frozen=True)
class Cell:
    task: Task
    setting: Setting
    seed: int
    root: pathlib.Path
    epochs: int
    extra: tuple[str, ...] = field(default=())

    @property
    def out(self) -> pathlib.Path:
        return self.root / self.task.name / self.setting.name / f"seed{self.seed}"

    def done(self) -> bool:
        return (self.out / "metrics.json").is_file()

    def recorded(self) -> Optional[tuple[str, Optional[dict]]]:
        """(what, fingerprint) of the run the cell's folder holds: its metrics.json where it
        finished, else its checkpoint.pt; None where it holds neither (a new cell)."""
        metrics, ck = self.out / "metrics.json", self.out / "checkpoint.pt"
        if metrics.is_file():
            try:
                fp = json.loads(metrics.read_text()).get("fingerprint")
            except (ValueError, AttributeError, OSError):
                fp = None  # unreadable: no fingerprint to match
            return str(metrics), fp
        if ck.is_file():
            import torch

            try:
                fp = torch.load(ck, map_location="cpu", weights_only=True).get("fingerprint")
            except Exception:  # noqa: BLE001 - any unreadable checkpoint has no fingerprint
                fp = None
            return str(ck), fp
        return None

    def exact_first(self) -> int:
        """Exact warm-up steps: whole epochs, or a share of the run (rounded)."""
        if self.setting.warmup_share:
            return round(self.setting.warmup_share * self.epochs * self.task.steps_per_epoch)
        return self.setting.warmup_epochs * (self.task.steps_per_epoch or 0)

    def command(self, device: str, data_root: Optional[str], fresh: bool = False) -> list[str]:
        """The `hot train` command of the cell; ``fresh``: replace what its folder holds (a run
        of another task) instead of resuming or keeping it."""
        cmd = [sys.executable, "-m", "hot.cli.main", "train", *self.task.flags,
               *self.setting.flags, "--epochs", str(self.epochs), "--seed", str(self.seed),
               "--device", device, "--out", str(self.out), "--no-plot", *self.extra]
        if self.setting.warmup_epochs or self.setting.warmup_share:
            cmd += ["--exact-steps", str(self.exact_first())]
        if self.setting.int8_epochs:
            cmd += ["--int8-steps", str(self.setting.int8_epochs * self.task.steps_per_epoch)]
        if self.setting.cooldown_epochs:
            start = max(0, self.epochs - self.setting.cooldown_epochs) * self.task.steps_per_epoch
            cmd += ["--exact-from", str(start)]
        if data_root and ("fashion-mnist" in self.task.flags
                          or "rotten-tomatoes-lm" in self.task.flags):
            cmd += ["--data-root", data_root]
        if fresh:
            cmd += ["--overwrite"]
        elif (self.out / "checkpoint.pt").is_file():  # an interrupted cell goes on where it was
            cmd += ["--resume", str(self.out / "checkpoint.pt")]
        return cmd


def _counts_epochs(s: Setting) -> bool:
    return bool(s.warmup_epochs or s.cooldown_epochs or s.int8_epochs or s.warmup_share)


def _run_cell(cell: Cell, device: str, data_root: Optional[str], threads: int,
              deadline: Optional[float], fresh: bool = False) -> tuple[Cell, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HOT_NO_PROGRESS="1")
    cell.out.parent.mkdir(parents=True, exist_ok=True)
    timeout = None if deadline is None else max(1.0, deadline - time.monotonic())
    t0 = time.monotonic()
    try:
        p = subprocess.run(cell.command(device, data_root, fresh), env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return cell, "stopped at the time limit (resumes from its checkpoint next time)"
    log = cell.out.parent / f"seed{cell.seed}.log"
    log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return cell, f"failed (exit {p.returncode}): {last}"
    return cell, f"done in {time.monotonic() - t0:.0f} s"


def run(args) -> int:
    tasks = parse_names("--tasks", args.tasks, TASKS)
    settings = parse_names("--settings", args.settings, all_settings())
    seed_list = parse_seeds(args.seeds)
    if args.workers < 1:
        raise StudyError(f"--workers {args.workers}: give 1 or more.")
    if args.train_size is not None:
        # the warm-ups' lengths are whole epochs of the tasks' full training sets
        settings_ok = [s for s in settings if not _counts_epochs(s)]
        if len(settings_ok) != len(settings):
            raise StudyError("--train-size changes the steps per epoch that the warm-up "
                             "settings count on; leave it out or drop those settings.")
    for t in tasks:
        for s in settings:
            if _counts_epochs(s) and t.steps_per_epoch is None:
                raise StudyError(f"setting {s.name} needs the steps per epoch of task {t.name}, "
                                 f"which it does not state; drop one of them.")
    root = pathlib.Path(args.out)
    extra = tuple(["--train-size", str(args.train_size)] if args.train_size is not None else [])
    cells = [Cell(t, s, seed, root, args.epochs if args.epochs is not None else t.epochs, extra)
             for t in tasks for s in settings for seed in seed_list]
    run_cells(cells, args.workers, args.device, args.data_root, args.time_limit,
              overwrite=args.overwrite)
    return table(argparse.Namespace(out=args.out))


def stale_cells(cells: list[Cell], device: str, data_root: Optional[str]) -> dict:
    """{cell: message} for the cells whose folder holds a run (finished or interrupted) of
    another task: its recorded fingerprint differs from the one its command would record.
    `python -m hot.cli.fingerprint` compares them from the command's own parse (hot.bench
    reaches hot.cli only through such processes, as it runs the cells)."""
    recorded = {c: c.recorded() for c in cells}
    held = [c for c in cells if recorded[c]]
    if not held:
        return {}
    asks = [[c.command(device, data_root)[3:], recorded[c][1]] for c in held]  # after `-m X`
    p = subprocess.run([sys.executable, "-m", "hot.cli.fingerprint"], input=json.dumps(asks),
                       capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1", HOT_NO_PROGRESS="1"))
    if p.returncode != 0:
        lines = p.stderr.strip().splitlines() or [f"exit status {p.returncode}"]
        raise StudyError(f"checking the cells' earlier runs failed: {lines[-1]}")
    return {c: f"{recorded[c][0]}: {what}" for c, what in zip(held, json.loads(p.stdout))
            if what is not None}


def run_cells(cells: list[Cell], workers: int, device: str, data_root: Optional[str],
              time_limit: Optional[float] = None, say=print, overwrite: bool = False) -> list[str]:
    """Run the cells that have not finished, ``workers`` at a time; returns one line per cell
    run (also passed to ``say``). A cell whose folder holds a run of another task (stale_cells)
    stops everything before any work with StudyError, unless ``overwrite``: then it runs anew."""
    stale = stale_cells(cells, device, data_root)
    if stale and not overwrite:
        first = next(iter(stale.values()))
        raise StudyError(f"{len(stale)} cell(s) hold runs of another task, e.g. {first}; give "
                         f"the options they were run with, another --out, or --overwrite to "
                         f"run them anew.")
    todo = [c for c in cells if c in stale or not c.done()]
    say(f"{len(cells)} cells, {len(cells) - len(todo)} finished earlier, {len(todo)} to run "
        f"on {workers} workers" + (f" ({len(stale)} replacing runs of another task)"
                                   if stale else ""))
    threads = max(1, (os.cpu_count() or 1) // workers)
    deadline = time.monotonic() + time_limit if time_limit else None
    lines = []
    with cf.ThreadPoolExecutor(workers) as ex:
        futs = [ex.submit(_run_cell, c, device, data_root, threads, deadline, c in stale)
                for c in todo]
        for f in cf.as_completed(futs):
            c, what = f.result()
            lines.append(f"{c.task.name} {c.setting.name} seed {c.seed}: {what}")
            say(lines[-1])
    return lines


def _mean_sd(v: list[float]) -> tuple[float, float]:
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else float("nan")
    return m, sd


def _paired_gap(mine: dict, ref: dict, metric: str) -> dict:
    """The gap to FP32 paired by seed, from seed -> value maps (the table's values): the mean
    over the seeds both have of mine - ref, or for perplexity of the relative change in % (the
    target is stated that way), its standard error and the seeds counted; {} without a common
    seed."""
    common = [k for k in mine if k in ref]
    if not common:
        return {}
    if metric == "val_ppl":
        d = [100 * (mine[k] / ref[k] - 1) for k in common]
    else:
        d = [mine[k] - ref[k] for k in common]
    g, gsd = _mean_sd(d)
    return dict(gap=g, gap_se=gsd / math.sqrt(len(d)) if len(d) > 1 else float("nan"),
                paired_seeds=len(d))


def hla_kept(setting: Setting, steps: int, exact_steps: int,
             rank_share: Optional[float] = None) -> Optional[float]:
    """Fraction of the paper setting's g_W multiply-add saving that ``setting`` keeps, when
    ``exact_steps`` of its ``steps`` ran exactly (warm-up and cool-down); ``rank_share``: the
    run's own share on its HOT steps where ranks differ by layer (hot train's hla_rank_share)."""
    if setting.rank is None:
        return None
    hot_share = max(0, steps - exact_steps) / steps if steps else 0.0
    if rank_share is not None:
        return rank_share * hot_share
    return (1 - setting.rank / 16) / (1 - 8 / 16) * hot_share


def collect(root: pathlib.Path, tasks: Optional[list[Task]] = None,
            settings: Optional[list[Setting]] = None,
            seeds: Optional[list[int]] = None) -> list[dict]:
    """One row per (task, setting) with finished cells, FP32's row first within a task;
    ``settings`` (default: all_settings()) are the ones looked for; with ``seeds``, of those seeds'
    cells only."""
    rows = []
    settings = list(settings or all_settings().values())
    for task in tasks or TASKS.values():
        runs = {}
        for s in settings:
            d = root / task.name / s.name
            for f in sorted(d.glob("seed*/metrics.json")) if d.is_dir() else []:
                m = json.loads(f.read_text())
                seed = int(f.parent.name[4:])
                if seeds is None or seed in seeds:
                    runs.setdefault(s.name, {})[seed] = m
        if not runs:
            continue
        scale = 100.0 if task.metric == "test_acc" else 1.0
        shown = {name: {k: scale * m[task.metric] for k, m in by_seed.items()}
                 for name, by_seed in runs.items()}
        for s in settings:
            if s.name not in runs:
                continue
            by_seed = runs[s.name]
            seeds = sorted(by_seed)
            vals = [shown[s.name][k] for k in seeds]
            mean, sd = _mean_sd(vals)
            row = {"task": task.name, "setting": s.name, "about": s.about, "metric": task.metric,
                   "seeds": seeds, "values": vals, "mean": mean, "sd": sd}
            if s.name != "fp32":
                row.update(_paired_gap(shown[s.name], shown.get("fp32", {}), task.metric))
            if s.pair in shown:
                g = _paired_gap(shown[s.name], shown[s.pair], task.metric)
                row.update({"pair": s.pair, **{"pair_" + k: v for k, v in g.items()}})
            one = next(iter(by_seed.values()))
            steps_run = one.get("steps") or 0
            exact = (round(s.warmup_share * steps_run) if s.warmup_share else
                     (s.warmup_epochs + s.cooldown_epochs) * (task.steps_per_epoch or 0))
            row["hla_kept"] = hla_kept(s, steps_run, exact,
                                       one.get("hla_rank_share") if s.per_layer else None)
            t = [m["time_per_step_s"] for m in by_seed.values() if m.get("time_per_step_s")]
            row["ms_per_step"] = 1e3 * sorted(t)[len(t) // 2] if t else None
            pk = [m["peak_memory_bytes"] for m in by_seed.values() if m.get("peak_memory_bytes")]
            row["peak_MiB"] = max(pk) / 2**20 if pk else None
            row["device"] = one.get("device")
            rows.append(row)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| task | setting | seeds | metric mean ± sd | gap to FP32 (paired) ± se | "
             "HLA kept | ms/step | peak MiB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        unit = "%" if r["metric"] == "test_acc" else " ppl"
        gap = (f"{r['gap']:+.2f}{' pts' if r['metric'] == 'test_acc' else ' %'} ± "
               f"{r['gap_se']:.2f}" if "gap" in r else "")
        kept = f"{r['hla_kept']:.2f}" if r["hla_kept"] is not None else ""
        ms = f"{r['ms_per_step']:.1f}" if r["ms_per_step"] else ""
        pk = f"{r['peak_MiB']:.0f}" if r["peak_MiB"] else ""
        lines.append(f"| {r['task']} | {r['setting']} | {len(r['seeds'])} | "
                     f"{r['mean']:.2f}{unit} ± {r['sd']:.2f} | {gap} | {kept} | {ms} | {pk} |")
    for r in rows:
        if "pair_gap" in r:
            pts = " pts" if r["metric"] == "test_acc" else " %"
            lines.append(f"\n{r['task']}: {r['setting']} against {r['pair']} (paired by seed, "
                         f"{r['pair_paired_seeds']} seeds): {r['pair_gap']:+.2f}{pts} ± "
                         f"{r['pair_gap_se']:.2f}")
    return "\n".join(lines)


def pair(rows: list[dict]) -> list[dict]:
    """Rows of several study.json files as one table: a later row of the same (task, setting)
    replaces an earlier one, and a row without a gap gets it from the FP32 row of its task,
    paired by seed (FP32's cells give the same results in every run: they are deterministic)."""
    by_key = {}
    for r in rows:
        by_key[(r["task"], r["setting"])] = dict(r)
    out = list(by_key.values())
    for r in out:
        ref = by_key.get((r["task"], "fp32"))
        if "gap" in r or ref is None or r["setting"] == "fp32":
            continue
        r.update(_paired_gap(dict(zip(r["seeds"], r["values"])),
                             dict(zip(ref["seeds"], ref["values"])), r["metric"]))
    order = {t: i for i, t in enumerate(TASKS)}
    out.sort(key=lambda r: (order.get(r["task"], len(order)), r["setting"] != "fp32"))
    return out


def plot(rows: list[dict], path: pathlib.Path) -> bool:
    """Accuracy against savings: per task, each setting's gap to FP32 (± se) against the share
    of HLA's saving it keeps, with the quality target's corner (gap within 0.3 points or 1%
    perplexity, at least half the saving). False, after a note, where matplotlib is missing or
    no row has both a gap and a saving."""
    from ..analysis.records import pyplot

    tasks = [t for t in dict.fromkeys(r["task"] for r in rows)
             if any("gap" in r and r.get("hla_kept") is not None for r in rows if r["task"] == t)]
    if not tasks:
        print(f"note: {path} not drawn: no row has both a gap and a saving", file=sys.stderr)
        return False
    plt = pyplot(path)
    if plt is None:
        return False
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.2), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        pts = [r for r in rows if r["task"] == t and "gap" in r and r.get("hla_kept") is not None]
        ppl = pts[0]["metric"] == "val_ppl"
        floor = -3.0  # accuracy gaps below this are drawn on the edge, their value in the label
        for r in pts:
            se = r["gap_se"] if math.isfinite(r["gap_se"]) else 0.0
            y, label = r["gap"], r["setting"]
            if not ppl and y < floor:
                y, label, se = floor, f"{label} ({r['gap']:.1f})", 0.0
            ax.errorbar(r["hla_kept"], y, yerr=se, fmt="v" if label != r["setting"] else "o",
                        ms=4, capsize=3)
            ax.annotate(label, (r["hla_kept"], y), fontsize=7, xytext=(4, 2),
                        textcoords="offset points")
        if not ppl:
            ax.set_ylim(floor - 0.2, 0.5)
        target = 1.0 if ppl else -0.3
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.axvline(0.5, color="grey", ls=":", lw=0.8)
        ax.axhline(0.0, color="black", lw=0.5)
        ax.set_xlabel("share of the paper setting's HLA g_W saving kept")
        ax.set_ylabel("perplexity vs FP32 (%)" if ppl else "accuracy gap to FP32 (points)")
        ax.set_title(t)
        if ppl:
            ax.set_yscale("symlog", linthresh=2.0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


ROW_KEYS = ("task", "setting", "metric", "seeds", "values")


def read_rows(path: str) -> list[dict]:
    """The rows of a study.json (or compare.json); StudyError, in one line, where the file is
    missing, is not JSON, or does not hold a list of rows."""
    fix = "give a study.json that `python -m hot.bench.study table` wrote."
    try:
        rows = json.loads(pathlib.Path(path).read_text())
    except OSError as e:
        raise StudyError(f"{path}: cannot read it ({e.strerror}); {fix}") from e
    except ValueError as e:
        raise StudyError(f"{path}: not JSON ({e}); {fix}") from e
    bad = not isinstance(rows, list) or any(
        not isinstance(r, dict) or any(k not in r for k in ROW_KEYS) for r in rows)
    if bad:
        raise StudyError(f"{path}: not a list of study rows (each with "
                         f"{', '.join(ROW_KEYS)}); {fix}")
    return rows


def merge(args) -> int:
    rows = []
    for f in args.json:
        rows += read_rows(f)
    rows = pair(rows)
    if args.tasks:
        keep = {t.strip() for t in args.tasks.split(",")}
        rows = [r for r in rows if r["task"] in keep]
    md = markdown(rows)
    if args.md:
        pathlib.Path(args.md).write_text(md + "\n")
    if args.png:
        plot(rows, pathlib.Path(args.png))  # says why where it draws nothing
    print(md)
    return 0


def table(args) -> int:
    root = pathlib.Path(args.out)
    rows = collect(root)
    if not rows:
        print(f"no finished cells under {root}")
        return 1
    md = markdown(rows)
    (root / "study.json").write_text(json.dumps(rows, indent=1))
    (root / "study.md").write_text(md + "\n")
    print(md)
    return 0


class _Parser(argparse.ArgumentParser):
    """Command-line mistakes as StudyError: one line, exit status 2, no usage block; no
    abbreviated options (--epoch is not --epochs), in the subcommands too."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message: str):
        # hot.cli.argtypes' messages are sentences that say what to give; argparse's are not
        raise StudyError(message if message.endswith(".") else
                         f"{message}; see `{self.prog} --help`.")


def _positive(kind):
    """argparse type: a finite ``kind`` (int or float) above 0; the message says what to give
    (the study has its own: hot.bench does not import hot.cli's argtypes)."""
    what = "a whole number" if kind is int else "a number"

    def parse(v: str):
        try:
            x = kind(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{v!r} is not {what}; give one above 0.") from None
        if not (x > 0 and math.isfinite(x)):
            raise argparse.ArgumentTypeError(f"{v} is not above 0; give {what} above 0.")
        return x

    return parse


def main(argv=None) -> int:
    p = _Parser(prog="python -m hot.bench.study", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the cells that have not finished, then the table")
    r.add_argument("--out", required=True, help="study folder (one sub-folder per cell)")
    r.add_argument("--tasks", default="tinyvit-fmnist", help=f"from {', '.join(TASKS)}")
    r.add_argument("--settings", default=DEFAULT_SETTINGS,
                   help=f"from {', '.join(all_settings())} (every recipe of hot.recipes)")
    r.add_argument("--seeds", default="0,1,2", help="comma-separated, distinct")
    r.add_argument("--workers", type=_positive(int), default=4, help="cells run at once")
    r.add_argument("--device", default="cuda", help="device of every cell (cpu, cuda[:N])")
    r.add_argument("--data-root", default=None,
                   help="hot train's --data-root for the Fashion-MNIST tasks (the IDX files) and "
                        "the LM task (hot.data.lm.export_lm_files); one folder may hold both")
    r.add_argument("--epochs", type=_positive(int), default=None,
                   help="override the task's epochs (1 or more)")
    r.add_argument("--train-size", type=_positive(int), default=None,
                   help="fewer training examples (1 or more)")
    r.add_argument("--time-limit", type=_positive(float), default=None,
                   help="seconds; cells still running then stop and resume on the next run")
    r.add_argument("--overwrite", action="store_true",
                   help="run anew the cells whose folder holds a run of another task (other "
                        "options or another hot); without it they stop the study")
    t = sub.add_parser("table", help="the table of the finished cells (study.json, study.md)")
    t.add_argument("--out", required=True, help="study folder")
    m = sub.add_parser("merge", help="study.json files of several runs as one table (gaps "
                       "paired with the FP32 rows), and the accuracy-versus-savings plot")
    m.add_argument("json", nargs="+", help="study.json files")
    m.add_argument("--tasks", default=None, help="only these tasks (comma-separated)")
    m.add_argument("--md", default=None, help="write the markdown table here")
    m.add_argument("--png", default=None, help="write the plot here")
    try:
        a = p.parse_args(argv)
        return run(a) if a.cmd == "run" else table(a) if a.cmd == "table" else merge(a)
    except StudyError as e:
        print(f"hot.bench.study: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
