"""`hot compare`: one task, several methods, several seeds; a table with each method's mean and
sd and its gap to FP32 paired by seed, JSON, markdown and a bar chart. Each run is a `hot train`
process with its own folder under --out (hot.bench.study's cells): a finished run is never rerun,
an interrupted one resumes from its checkpoint."""

from __future__ import annotations

import argparse
import json
import pathlib

from .. import recipes
from ..bench import study
from . import argtypes as T
from . import plots
from .common import CLIError, emit
from .outputs import write_text

# set by compare itself, per run
_OWN_FLAGS = ("--method", "--seed", "--out", "--device", "--resume", "--overwrite", "--json")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="several methods x seeds on one task: table, JSON, bar chart",
        description="Train one task with several methods and seeds (each run a `hot train` "
        "process; arguments after `--` are hot train's task options: --model, --dataset, "
        "--epochs, ...), then print each method's accuracy (or perplexity) as mean +- sd over "
        "the seeds, its gap to FP32 paired by seed with its standard error, time per step and "
        "peak memory. Writes compare.json, compare.md and compare.png into --out. Finished runs "
        "are not rerun; the three result files are rebuilt from the runs each time.")
    p.add_argument("--methods", type=T.method_list, default="fp32,hot",
                   help=f"comma-separated, from {', '.join(recipes.names())} (default fp32,hot)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--out", required=True, help="folder of the runs and the results")
    p.add_argument("--workers", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--device", default="cpu", help="device of every run (default cpu)")
    p.add_argument("--overwrite", action="store_true",
                   help="run anew the runs under --out that another task (other options, "
                        "another hot) left there; without it such runs stop the command")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="hot train's task options after --")
    p.set_defaults(func=run)


def _task(rest: list[str]) -> study.Task:
    rest = [a for a in rest if a != "--"]
    for flag in _OWN_FLAGS:
        if flag in rest:
            raise CLIError(f"{flag} after `--` is set by hot compare itself for every run; "
                           f"drop it (methods: --methods, seeds: --seeds, folder: --out).")
    epochs = 1
    if "--epochs" in rest:
        i = rest.index("--epochs")
        try:
            epochs = int(rest[i + 1])
        except (IndexError, ValueError):
            raise CLIError("--epochs after `--` needs a whole number, e.g. --epochs 3.")
        if epochs < 1:
            raise CLIError(f"--epochs {epochs} after `--`: give 1 or more.")
        rest = rest[:i] + rest[i + 2:]
    lm = "rotten-tomatoes-lm" in rest
    return study.Task("compare", tuple(rest), "val_ppl" if lm else "test_acc", epochs)


def run(args) -> int:
    # one cell folder per method, named as the method: <out>/compare/<method>/seed<N>
    settings = [study.recipe_setting(m) for m in args.methods]
    try:
        seeds = study.parse_seeds(args.seeds)
    except study.StudyError as e:
        raise CLIError(str(e))
    if args.workers < 1:
        raise CLIError(f"--workers {args.workers}: give 1 or more.")
    task = _task(args.rest)
    root = pathlib.Path(args.out)
    cells = [study.Cell(task, s, seed, root, task.epochs) for s in settings for seed in seeds]
    try:
        log = study.run_cells(cells, args.workers, args.device, None, overwrite=args.overwrite,
                              say=lambda line: print(line, flush=True) if not args.json else None)
    except study.StudyError as e:
        raise CLIError(str(e))
    failed = [line for line in log if ": failed" in line]
    # FP32's cells are looked for even when not asked for: a gap pairs with them by seed
    looked = {s.name: s for s in [study.recipe_setting("fp32"), *settings]}
    wanted = {s.name for s in settings}
    rows = [r for r in study.collect(root, [task], list(looked.values()), seeds)
            if r["setting"] in wanted]
    for r in rows:
        r["method"] = r["setting"]
    if not rows:
        raise CLIError(f"no run finished under {root}" + (f"; first failure: {failed[0]}"
                                                           if failed else "."))
    by_method = [dict(r, setting=r["method"]) for r in rows]
    md = study.markdown(by_method).replace("| setting |", "| method |")
    write_text(root / "compare.json", json.dumps(rows, indent=1))
    write_text(root / "compare.md", md + "\n")
    png = plots.method_bars(by_method, root / "compare.png",
                "test accuracy (%)" if task.metric == "test_acc" else "validation perplexity")
    text = md + (f"\n\nfailed runs (their logs are beside their folders):\n" + "\n".join(failed)
                 if failed else "") + f"\n\nresults in {root}/ (compare.json, compare.md" + \
        (", compare.png)" if png else ")")
    emit(args, {"rows": rows, "failed": failed, "plot": png}, text)
    return 0 if not failed else 2
