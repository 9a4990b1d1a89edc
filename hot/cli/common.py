"""Shared pieces of the subcommands: HOT config options, output (table or JSON), progress."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Iterable, Optional

import torch

import hot
from hot import recipes
from hot.recipes import Recipe
from hot.common.config import SELECTIONS, HOTConfig

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
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return PlainProgress(it, desc, total)
    return tqdm(it, desc=desc, total=total, leave=leave, file=sys.stderr, dynamic_ncols=True)


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


_DEFAULT = HOTConfig()  # the flags' defaults are HOTConfig()'s, never restated


def add_hot_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HOT configuration (defaults: HOTConfig()'s)")
    g.add_argument("--hq-bits", type=T.hq_bits, default=_DEFAULT.hq.bits,
                   metavar="{auto,4,8,none}",
                   help="g_x path operand width (auto: 4 where the GPU has INT4 tensor cores, "
                        "else 8)")
    g.add_argument("--gy-scale", choices=("auto", "token", "tensor"), default="auto",
                   help="g_y scaling on the g_x path; auto = LQS picks per layer")
    g.add_argument("--hla-rank", type=T.hla_rank, default=8, metavar="{1,2,4,8,16}",
                   help="Walsh coefficients kept per block of 16 token rows (default 8)")
    g.add_argument("--hla-selection", choices=SELECTIONS, default=_DEFAULT.hla.selection,
                   help="which coefficients HLA keeps: lowpass and lp_l1 are the paper's fixed "
                        "(biased) rows, stratified draws them per block (unbiased), auto: "
                        "stratified on Linear layers, lowpass on Conv2d")
    g.add_argument("--hla-blocking", choices=("flat", "sequence"), default="flat",
                   help="token blocks over the flattened axis or inside each sequence")
    g.add_argument("--hla-bits", type=T.bits, default=8, metavar="{4,8,none}",
                   help="g_W path operand width (default 8)")
    g.add_argument("--abc", choices=("save", "recompute", "auto"), default="auto",
                   help="what the forward keeps for g_W: the int8 codes (save, paper) or x, "
                        "with the codes formed in backward (recompute), or recompute where x is "
                        "kept anyway (auto)")
    g.add_argument("--hla-amax", choices=("current", "delayed"), default="current",
                   help="g_W path channel scales: this pass's absmax (current, paper) or the "
                        "previous pass's, checked against this one's (delayed: one read of "
                        "g_y and x on the GPU)")
    g.add_argument("--lqs-ratio", type=T.unit_fraction, default=0.5,
                   help="LQS threshold, in (0, 1] (default 0.5)")
    g.add_argument("--exact-steps", type=T.nonnegative_int, default=0,
                   help="exact warm-up backward steps")
    g.add_argument("--int8-steps", type=T.nonnegative_int, default=0,
                   help="steps with the g_x path at 8 bits after the warm-up")
    g.add_argument("--exact-from", type=T.nonnegative_int, default=None,
                   help="exact backward from this step on (a cool-down; default: never)")
    g.add_argument("--backend", choices=("auto", "reference", "fast"), default=None,
                   help="HOT backend (default: $HOT_BACKEND, else auto)")


# The flags that shape HOT's quantizers, with their defaults: a recipe that is not tunable
# (hot.recipes.Recipe.tunable) has its own quantizers and takes none of them.
_QUANTIZER_FLAGS = {"hq_bits": _DEFAULT.hq.bits, "gy_scale": _DEFAULT.hq.gy_scale,
                    "hla_rank": _DEFAULT.hla.rank, "hla_selection": _DEFAULT.hla.selection,
                    "hla_blocking": _DEFAULT.hla.blocking, "hla_bits": _DEFAULT.hla.bits,
                    "abc": _DEFAULT.hla.abc, "hla_amax": _DEFAULT.hla.amax,
                    "lqs_ratio": _DEFAULT.lqs.ratio, "hla_full_rank": ()}


def method_recipe(name: str) -> Recipe:
    """The recipe of a --method value; CLIError naming it and the choices where none is."""
    try:
        return recipes.get(name)
    except recipes.RecipeError as e:
        raise CLIError(str(e)) from e


def hot_config(args, recipe: Optional[Recipe] = None) -> hot.HOTConfig:
    """The HOTConfig that ``recipe`` (default: the one --method names, else hot) trains with
    under the command line's flags. A tunable recipe's config, and an exact recipe's (recorded,
    not used), comes from the quantizer flags; any other recipe keeps its own quantizers and
    takes only the schedule flags (CLIError where a quantizer flag is given)."""
    recipe = recipe or method_recipe(getattr(args, "method", None) or "hot")
    schedule = dict(exact_steps=args.exact_steps, int8_steps=args.int8_steps,
                    exact_from=args.exact_from)
    if not (recipe.tunable or recipe.exact):
        given = [k for k, v in _QUANTIZER_FLAGS.items() if getattr(args, k, v) != v]
        if given:
            flag = "--" + given[0].replace("_", "-")
            tunable = ", ".join(r.name for r in recipes.RECIPES.values() if r.tunable)
            raise CLIError(f"{flag} shapes HOT's quantizers; method {recipe.name} has its own "
                           f"({recipe.summary}) and takes only the schedule flags: drop {flag}, "
                           f"or use a method the flags shape ({tunable}).")
        return recipe.config.replace(**schedule)
    base = recipe.config or hot.HOTConfig()
    return base.replace(
        hq={"bits": args.hq_bits, "gy_scale": args.gy_scale},
        hla={"rank": args.hla_rank, "selection": args.hla_selection,
             "blocking": args.hla_blocking, "bits": args.hla_bits, "abc": args.abc,
             "amax": args.hla_amax},
        lqs={"ratio": args.lqs_ratio}, **schedule)


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


