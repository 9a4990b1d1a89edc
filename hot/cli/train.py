"""`hot train`: train a model with one method; metrics (JSON/CSV), checkpoint and plots."""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import time

from ..data import DATASETS, LM_DATASETS, load_dataset
from ..models import build_model, describe_model_spec
from . import plots
from .common import (CLIError, add_hot_args, add_json_flag, device_from, emit, fmt_bytes,
                     hot_config, render_table)
from .methods import METHODS
from .trainer import RunSpec, train_run


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help="train a model with fp32, bf16, hot or hot-bf16",
        description="Train a model on a dataset with one method and write metrics.json, "
        "metrics.csv, checkpoint.pt and curves.png into the output folder. Resuming "
        "(--resume) restores weights, optimizer, schedule and HOT's step counters and LQS "
        "decisions.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="tiny-vit", help=describe_model_spec())
    p.add_argument("--dataset", default="fashion-mnist", choices=sorted(DATASETS),
                   help="; ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    p.add_argument("--data-root", default=None, help="local data folder (cifar*, imagefolder, "
                   "or Fashion-MNIST elsewhere)")
    p.add_argument("--method", default="hot", choices=sorted(METHODS),
                   help="; ".join(f"{k}: {m.help}" for k, m in METHODS.items()))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=None, help="default 1e-3, or 5e-5 for text models")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-size", type=int, default=None, help="fixed random training subset")
    p.add_argument("--test-size", type=int, default=None, help="fixed random test subset")
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps (smoke runs)")
    p.add_argument("--image-size", type=int, default=None, help="resize images to this square size")
    p.add_argument("--max-len", type=int, default=64, help="tokens per text example")
    p.add_argument("--lora-r", type=int, default=0, help="LoRA rank via peft (0 = full training); "
                   "HOT then applies only to the frozen base layers")
    p.add_argument("--lora-alpha", type=int, default=16)
    p.add_argument("--vit-dim", type=int, default=128)
    p.add_argument("--vit-depth", type=int, default=6)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--out", default=None, help="output folder (default runs/<model>-<dataset>-<method>)")
    p.add_argument("--resume", default=None, help="checkpoint.pt to continue from (with the "
                   "same --epochs, so that the learning-rate schedule is the same)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="also keep checkpoint-epoch<N>.pt after every epoch")
    p.add_argument("--no-plot", action="store_true")
    add_hot_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.dataset in LM_DATASETS:
        from .lmtrain import run_lm

        return run_lm(args)
    device = device_from(args.device)
    data = load_dataset(args.dataset, args.data_root, train_size=args.train_size,
                        test_size=args.test_size, seed=args.seed, image_size=args.image_size or 32)
    shape = None
    if data.kind == "image":
        shape = data.shape if not args.image_size else (data.shape[0], args.image_size, args.image_size)
    text_model = args.model == "minilm" or pathlib.Path(args.model).is_dir()
    if (data.kind == "text") != text_model:
        raise CLIError(f"--model {args.model} and --dataset {args.dataset} do not fit together: "
                       f"text datasets need a HuggingFace text model (e.g. --model minilm), "
                       f"image datasets an image model (tiny-vit or a timm name).")
    lr = args.lr if args.lr is not None else (5e-5 if data.kind == "text" else 1e-3)
    name = f"{pathlib.Path(args.model).name}-{args.dataset}-{args.method}"
    out = pathlib.Path(args.out or pathlib.Path("runs") / name)
    out.mkdir(parents=True, exist_ok=True)
    builder = lambda: build_model(args.model, classes=data.classes, input_shape=shape,
                                  vit_dim=args.vit_dim, vit_depth=args.vit_depth)
    spec = RunSpec(method=args.method, epochs=args.epochs, lr=lr, weight_decay=args.weight_decay,
                   batch_size=args.batch_size, seed=args.seed, hot_config=hot_config(args),
                   backend=args.backend, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                   max_len=args.max_len, image_size=args.image_size, max_steps=args.max_steps,
                   checkpoint=str(out / "checkpoint.pt"), resume=args.resume,
                   keep_checkpoints=args.keep_checkpoints)
    t0 = time.perf_counter()
    r = train_run(builder, data, spec, device, label=args.method)
    model = r.pop("model")
    lqs = {n: int(m.hot_lqs) for n, m in _hot_layers(model)}
    hot_steps = {n: int(m.hot_step) for n, m in _hot_layers(model)}
    result = {"model": args.model, "dataset": data.name, "data_note": data.note,
              "train_examples": len(data.y_train) if data.kind == "image" else len(data.train),
              "test_examples": len(data.y_test) if data.kind == "image" else len(data.test),
              "lr": lr, "lora_r": args.lora_r, "hot_config": spec.hot_config.to_dict(),
              "lqs": lqs, "hot_steps": hot_steps, "out": str(out), "wall_time_s": time.perf_counter() - t0, **r}
    (out / "metrics.json").write_text(json.dumps(result, indent=1, default=str))
    with open(out / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "step", "train_loss", "test_acc"])
        w.writeheader()
        w.writerows(r["history"]["epochs"])
    if not args.no_plot:
        result["plot"] = plots.curves([r], out / "curves.png", f"{name}")
    text = render_table(["method", "test acc %", "steps", "ms/step", "peak memory", "saved by linears"],
                        [[args.method, f"{100 * r['test_acc']:.2f}", r["steps"],
                          f"{1000 * r['time_per_step_s']:.0f}", fmt_bytes(r["peak_memory_bytes"]),
                          fmt_bytes(r["saved_bytes_linear"])]])
    text += f"\n\noutputs in {out}/ (metrics.json, metrics.csv, checkpoint.pt" + \
            (", curves.png)" if not args.no_plot else ")")
    emit(args, result, text)
    return 0


def _hot_layers(model):
    import hot

    return hot.hot_layers(model)
