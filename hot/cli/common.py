"""Shared pieces of the subcommands: HOT config options, output (table or JSON), progress."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Iterable, Optional

import torch

import hot
from hot import recipes
from hot.recipes import Recipe
from hot.common.config import ABC_MODES, FORWARDS, SELECTIONS, HOTConfig

from ..analysis.records import finite
from . import argtypes as T


class CLIError(Exception):
    """An error to show the user as-is (already says what to do); exit status 2."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def progress_enabled() -> bool:
    """Whether the subcommands show progress; HOT_NO_PROGRESS=1 turns it off (options)."""
    from ..common.options import options

    return options().progress


def progress(it: Iterable, desc: str, total: Optional[int] = None, leave: bool = False):
    """A tqdm bar on stderr (stdout stays clean for --json). Without tqdm, plain lines on
    stderr (PlainProgress); with progress turned off (progress_enabled), the iterable itself."""
    if not progress_enabled():
        return it
    if not _isatty(sys.stderr):  # a log file: a bar's redraws would flood it
        return PlainProgress(it, desc, total)
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return PlainProgress(it, desc, total)
    return tqdm(it, desc=desc, total=total, leave=leave, file=sys.stderr, dynamic_ncols=True)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or file-like stream
        return False


class PlainProgress:
    """Progress as plain lines on stderr ("desc: 40/157, loss=0.512"), for installs without
    tqdm: a line at most every ``every_s`` seconds while iterating, and one at the end."""

    def __init__(self, it: Iterable, desc: str, total: Optional[int] = None,
                 every_s: float = 10.0):
        self.it, self.desc, self.every_s = it, desc, every_s
        self.total = total if total is not None else _len(it)
        self.postfix = ""

    def set_postfix(self, **kw) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def _line(self, n: int) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        log(f"{self.desc}: {n}{of}" + (f", {self.postfix}" if self.postfix else ""))

    def __iter__(self):
        n, shown, last = 0, None, time.monotonic()
        for x in self.it:
            yield x
            n += 1
            if time.monotonic() - last >= self.every_s:
                self._line(n)
                shown, last = n, time.monotonic()
        if shown != n:
            self._line(n)


def _len(it) -> Optional[int]:
    try:
        return len(it)
    except TypeError:
        return None


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true",
                   help="print one JSON object on stdout (progress and notes go to stderr)")


def default_threads() -> int:
    """torch's intra-op threads unless --threads says: $OMP_NUM_THREADS where set (hot compare
    and the study set it per run), else 1 on a machine of 2 cores or fewer (two threads thrash
    there when anything else runs: steps 10-40x slower), else min(4, cores)."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 1 if (cores or 1) <= 2 else min(4, cores)


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=T.positive_int, default=None,
                   help="torch's CPU threads (default: $OMP_NUM_THREADS, else 1 on 2 cores or "
                        "fewer, else min(4, cores); docs/cli.md says why)")


def apply_threads(args) -> int:
    """Set torch's intra-op threads from --threads (or default_threads); returns the count."""
    n = args.threads or default_threads()
    torch.set_num_threads(n)
    return n


_DEFAULT = HOTConfig()  # the flags' defaults are HOTConfig()'s, never restated

# HOT's flags: where each lands in HOTConfig (sub-config, or None for a top-level field). The
# flags default to "not given" (argparse.SUPPRESS), so that --hot-config FILE fills what they
# leave out and a given flag overrides the file; without the file, HOTConfig()'s defaults (or a
# recipe's own config) fill them.
HOT_FLAGS = {"hq_bits": ("hq", "bits"), "gy_scale": ("hq", "gy_scale"),
             "hla_rank": ("hla", "rank"), "hla_selection": ("hla", "selection"),
             "hla_blocking": ("hla", "blocking"), "hla_bits": ("hla", "bits"),
             "abc": ("hla", "abc"), "hla_amax": ("hla", "amax"), "hla_share": ("hla", "share"),
             "lqs_ratio": ("lqs", "ratio"), "exact_steps": (None, "exact_steps"),
             "int8_steps": (None, "int8_steps"), "exact_from": (None, "exact_from"),
             "forward": (None, "forward")}
_SCHEDULE_FLAGS = ("exact_steps", "int8_steps", "exact_from")


def _default_of(flag: str):
    """HOTConfig()'s value of a HOT flag's field (what the flag's help states as its default)."""
    sub, name = HOT_FLAGS[flag]
    return getattr(_DEFAULT if sub is None else getattr(_DEFAULT, sub), name)


def add_hot_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HOT configuration (defaults: HOTConfig()'s)")

    def add(*a, help: str, **kw):
        # help states HOTConfig()'s default itself: the option's own default is SUPPRESS
        key = a[0][2:].replace("-", "_")
        d = _default_of(key)
        g.add_argument(*a, default=argparse.SUPPRESS,
                       help=f"{help} (default {'never' if d is None else d})", **kw)

    g.add_argument("--hot-config", default=None, metavar="FILE",
                   help="a JSON file of HOTConfig.to_dict() (every field; missing ones take "
                        "their defaults); the flags below override it")
    add("--hq-bits", type=T.hq_bits, metavar="{auto,4,8,none}",
        help="g_x path operand width (auto: 4 where the GPU has INT4 tensor cores, else 8)")
    add("--gy-scale", choices=("auto", "token", "tensor"),
        help="g_y scaling on the g_x path; auto = LQS picks per layer")
    add("--hla-rank", type=T.hla_rank, metavar="{1,2,4,8,16}",
        help="Walsh coefficients kept per block of 16 token rows")
    add("--hla-selection", choices=SELECTIONS,
        help="which coefficients HLA keeps: lowpass and lp_l1 are the paper's fixed (biased) "
             "rows, stratified draws them per block (unbiased), auto: stratified on Linear "
             "layers, lowpass on Conv2d")
    add("--hla-blocking", choices=("flat", "sequence"),
        help="token blocks over the flattened axis or inside each sequence")
    add("--hla-bits", type=T.bits, metavar="{4,8,none}", help="g_W path operand width")
    add("--abc", choices=ABC_MODES,
        help="what the forward keeps for g_W: the int8 codes (save, paper) or x, with the codes "
             "formed in backward (recompute), or recompute where x is kept anyway; offload: "
             "the codes in host memory until backward (CUDA, not under CUDA graphs)")
    add("--hla-amax", choices=("current", "delayed"),
        help="g_W path channel scales: this pass's absmax (current, paper) or the previous "
             "pass's, checked against this one's (delayed: one read of g_y and x on the GPU)")
    add("--hla-share", choices=("none", "siblings"),
        help="siblings: Linear layers of one parent and input width share the seeds of x's "
             "codes, so layers reading one input (q/k/v, gate/up) form its codes once under "
             "torch.compile")
    add("--lqs-ratio", type=T.unit_fraction, help="LQS threshold, in (0, 1]")
    add("--forward", choices=FORWARDS,
        help="the forward GEMM: exact, or int8 (HQ on x and W, round to nearest)")
    add("--exact-steps", type=T.nonnegative_int, help="exact warm-up backward steps")
    add("--int8-steps", type=T.nonnegative_int,
        help="steps with the g_x path at 8 bits after the warm-up")
    add("--exact-from", type=T.nonnegative_int,
        help="exact backward from this step on (a cool-down)")
    g.add_argument("--backend", choices=("auto", "reference", "fast"), default=None,
                   help="HOT backend (default: $HOT_BACKEND, else auto)")


def method_recipe(name: str) -> Recipe:
    """The recipe of a --method value; CLIError naming it and the choices where none is."""
    try:
        return recipes.get(name)
    except recipes.RecipeError as e:
        raise CLIError(str(e)) from e


def _config_file(path: str) -> hot.HOTConfig:
    """The HOTConfig in the JSON file ``path`` (HOTConfig.to_dict()); CLIError naming
    --hot-config where it cannot be read or is not a HOTConfig."""
    fix = "give a JSON file of HOTConfig.to_dict() (e.g. json.dump(HOTConfig().to_dict(), f))."
    try:
        with open(path) as f:
            d = json.load(f)
    except OSError as e:
        raise CLIError(f"--hot-config {path}: cannot read it ({e.strerror}); {fix}") from e
    except ValueError as e:
        raise CLIError(f"--hot-config {path}: not JSON ({one_line_of(e)}); {fix}") from e
    if not isinstance(d, dict):
        raise CLIError(f"--hot-config {path}: holds a {type(d).__name__}, not an object; {fix}")
    try:
        cfg = hot.HOTConfig.from_dict(d)
    except (ValueError, TypeError) as e:
        raise CLIError(f"--hot-config {path}: {one_line_of(e)}") from e
    if cfg.method != "hot":
        raise CLIError(f"--hot-config {path} sets method {cfg.method!r}; use --method "
                       f"{cfg.method.replace('_', '-')} for that baseline (without "
                       f"--hot-config), or set \"method\": \"hot\".")
    return cfg


def one_line_of(e: BaseException) -> str:
    return " ".join(str(e).split())


def hot_config(args, recipe: Optional[Recipe] = None) -> hot.HOTConfig:
    """The HOTConfig that ``recipe`` (default: the one --method names, else hot) trains with
    under the command line's HOT flags. A tunable recipe's config, and an exact recipe's
    (recorded, not used), is --hot-config FILE (else the recipe's own config, else HOTConfig())
    with every flag given on the command line overriding it; any other recipe keeps its own
    quantizers and takes only the schedule flags (CLIError where a quantizer flag or
    --hot-config is given)."""
    recipe = recipe or method_recipe(getattr(args, "method", None) or "hot")
    given = {k: getattr(args, k) for k in HOT_FLAGS if hasattr(args, k)}
    file = getattr(args, "hot_config", None)
    if not (recipe.tunable or recipe.exact):
        shaping = [k for k in given if k not in _SCHEDULE_FLAGS]
        shaping += ["hla_full_rank"] if getattr(args, "hla_full_rank", ()) else []
        shaping += ["hot_config"] if file else []
        if shaping:
            flag = "--" + shaping[0].replace("_", "-")
            tunable = ", ".join(r.name for r in recipes.RECIPES.values() if r.tunable)
            raise CLIError(f"{flag} shapes HOT's quantizers; method {recipe.name} has its own "
                           f"({recipe.summary}) and takes only the schedule flags: drop {flag}, "
                           f"or use a method the flags shape ({tunable}).")
        return recipe.config.replace(**given)
    cfg = _config_file(file) if file else (recipe.config or hot.HOTConfig())
    changes: dict = {}
    for k, v in given.items():
        sub, name = HOT_FLAGS[k]
        if sub is None:
            changes[name] = v
        else:
            changes.setdefault(sub, {})[name] = v
    return cfg.replace(**changes) if changes else cfg


def device_from(name: Optional[str]) -> torch.device:
    """--device: auto (CUDA where visible, else CPU), cpu, or cuda[:N] of a visible GPU."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise CLIError(f"--device {name}: not a device name; use auto, cpu or cuda[:N].")
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise CLIError(f"--device {name}: no CUDA GPU is visible here; use --device cpu.")
        if dev.index is not None and dev.index >= n:
            raise CLIError(f"--device {name}: only {n} CUDA GPU(s) are visible (cuda:0 to "
                           f"cuda:{n - 1}); pick one of them.")
    elif dev.type != "cpu":
        raise CLIError(f"--device {name}: the hot command runs on cpu or cuda; use one of them.")
    return dev


def check_backend(args, device: torch.device) -> None:
    """--backend fast needs a CUDA device: say so before anything is built."""
    if getattr(args, "backend", None) == "fast" and device.type != "cuda":
        raise CLIError(f"--backend fast: the fast kernels run on CUDA GPUs and the device is "
                       f"{device}; use --backend reference (or auto) here.")


def fmt_bytes(n) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024


def render_table(headers: list[str], rows: list[list]) -> str:
    """A plain monospace table (right-aligned except the first column)."""
    cells = [[str(h) for h in headers]] + [[_cell(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))
    return "\n".join([line(cells[0]), "  ".join("-" * x for x in w)] + [line(r) for r in cells[1:]])


def _cell(c) -> str:
    if isinstance(c, float):
        if math.isinf(c) or math.isnan(c):
            return str(c)
        return f"{c:.4g}" if abs(c) < 1e4 else f"{c:.1f}"
    return "" if c is None else str(c)


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def emit(args, result: dict, text: str) -> None:
    """--json: the result as one JSON object on stdout; else the human-readable text."""
    if getattr(args, "json", False):
        print(json.dumps(finite(result), default=_json_default, indent=1))
    else:
        print(text)


