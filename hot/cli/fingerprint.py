"""A run's fingerprint: everything that determines its result, recorded in its metrics.json and
checkpoint, so that a finished or interrupted run is reused only for the task it ran.

``hot train`` resuming, ``hot compare`` and ``hot.bench.study`` compare the fingerprint a run
recorded with the one the current command would record; a difference is refused with one line
naming the differing fields (``refuse``), unless ``--overwrite`` is given.
"""

from __future__ import annotations

import functools
import json
import pathlib
import subprocess
import sys
from typing import Optional

from .common import CLIError

# `hot train` options that change what a run computes. Output-only options (--out, --no-plot,
# --keep-checkpoints, --json) and --threads (the same sums in another order at most) are not.
RESULT_FLAGS = ("model", "dataset", "data_root", "train_size", "test_size", "image_size",
                "max_len", "batch_size", "lr", "weight_decay", "method", "seed", "epochs",
                "max_steps", "lora_r", "lora_alpha", "lora_hot", "vit_dim", "vit_depth",
                "hla_full_rank", "backend", "exclude", "compile")


@functools.lru_cache(maxsize=1)
def code_version() -> dict:
    """The package version and, in a git checkout, its HEAD commit (None elsewhere)."""
    from .. import __version__

    root = pathlib.Path(__file__).resolve().parents[2]
    head = None
    if (root / ".git").exists():
        try:
            p = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"],
                               capture_output=True, text=True, timeout=10)
            head = p.stdout.strip() if p.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            head = None  # no git here: the package version alone
    return {"version": __version__, "git": head}


def _plain(v):
    # JSON's view of the value (tuples become lists), so that a recorded fingerprint read back
    # from metrics.json compares equal to a freshly made one.
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def train_fingerprint(args, device_type: str, hot_config: dict) -> dict:
    """The fingerprint of the `hot train` run that ``args`` (parsed options) describe, on a
    device of ``device_type`` ('cpu' or 'cuda') with the HOT configuration ``hot_config``
    (HOTConfig.to_dict(); it also carries what --hot-config FILE set)."""
    fp = {k: getattr(args, k, None) for k in RESULT_FLAGS}
    fp.update(hot_config=hot_config, device=device_type, code=code_version())
    return _plain(fp)


def differences(recorded: Optional[dict], current: dict) -> list[str]:
    """The fields in which ``recorded`` differs from ``current``; ['fingerprint'] when nothing
    was recorded (a run written by an older hot)."""
    if not isinstance(recorded, dict):
        return ["fingerprint"]
    keys = list(dict.fromkeys([*current, *recorded]))
    return [k for k in keys if _plain(recorded.get(k)) != current.get(k)]


def describe(recorded: Optional[dict], current: dict, fields: list[str]) -> str:
    """'lr (recorded 0.001, now 0.01), method (...)': what differs, for the message."""
    if fields == ["fingerprint"]:
        return "no fingerprint recorded (written by an older hot)"
    parts = []
    for k in fields[:4]:
        if k == "code":
            parts.append("code (another hot version or git commit)")
        elif k == "hot_config":
            parts.append("hot_config (the HOT configuration)")
        else:
            parts.append(f"{k} (recorded {recorded.get(k)!r}, now {current.get(k)!r})")
    more = f" and {len(fields) - 4} more" if len(fields) > 4 else ""
    return ", ".join(parts) + more


def refuse(what: str, recorded: Optional[dict], current: dict) -> None:
    """CLIError when ``recorded`` is not ``current``: ``what`` (e.g. "--resume PATH") holds a
    run of another task; the message names the differing fields and --overwrite."""
    fields = differences(recorded, current)
    if fields:
        raise CLIError(f"{what} holds a run of another task: {describe(recorded, current, fields)}"
                       f"; give the options it was run with, another output folder, or "
                       f"--overwrite to replace it with a new run.")


def of_command(argv: list[str]) -> dict:
    """The fingerprint the `hot train` command ``argv`` (its arguments after `hot`, from
    "train" on) would record, from the command's own parse (so the two never disagree)."""
    from .common import device_from, hot_config
    from .main import build_parser

    args = build_parser().parse_args(argv)
    return train_fingerprint(args, device_from(args.device).type, hot_config(args).to_dict())


def stale(argv: list[str], recorded: Optional[dict]) -> Optional[str]:
    """None where the `hot train` command ``argv`` would record ``recorded``; else what differs
    (describe)."""
    current = of_command(argv)
    fields = differences(recorded, current)
    return describe(recorded, current, fields) if fields else None


def main() -> int:
    """`python -m hot.cli.fingerprint`: stdin a JSON list of [argv, recorded fingerprint] pairs
    (argv: a `hot train` command's arguments from "train" on), stdout the JSON list of stale()'s
    answers. hot.bench.study checks its cells through this process, as it runs them through
    `python -m hot.cli.main`: hot.bench does not import hot.cli. A command that does not parse
    exits with status 2 and one line on stderr."""
    try:
        answers = [stale(argv, recorded) for argv, recorded in json.load(sys.stdin)]
    except CLIError as e:
        print(" ".join(str(e).split()), file=sys.stderr)
        return 2
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
