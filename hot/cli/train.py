"""`hot train`: train a model with one method; metrics (JSON/CSV), checkpoint and plots."""

from __future__ import annotations

import argparse
import json
import pathlib
import time
from typing import Optional

import hot
from hot import recipes

from ..data import DATASETS, LM_DATASETS, load_dataset
from ..models import build_model, describe_model_spec
from . import argtypes as T
from . import plots
from .common import (CLIError, add_hot_args, add_json_flag, add_threads_flag, apply_threads,
                     check_backend, device_from, emit, fmt_bytes, hot_config, log, render_table)
from .fingerprint import differences, refuse, train_fingerprint
from .methods import rank_record
from .modelargs import check_fits, check_tiny_vit
from .outputs import add_overwrite_flag, claim, csv_text, write_text
from .trainer import (LORA_HOT, RunSpec, checkpoint_complete, epoch_checkpoint, read_checkpoint,
                      train_run)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "train", help=f"train a model with one method ({', '.join(recipes.names())})",
        description="Train a model on a dataset with one method and write metrics.json, "
        "metrics.csv, checkpoint.pt and curves.png into the output folder. Resuming "
        "(--resume) restores weights, optimizer, schedule and HOT's step counters and LQS "
        "decisions. Results an earlier run left in the folder are never replaced without "
        "--overwrite, and the folder is created only when the first checkpoint is written.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="tiny-vit", help=describe_model_spec())
    p.add_argument("--dataset", default="fashion-mnist", choices=sorted(DATASETS),
                   help="; ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    p.add_argument("--data-root", default=None, help="local data folder (cifar*, imagefolder, "
                   "or Fashion-MNIST elsewhere)")
    p.add_argument("--method", default="hot", choices=recipes.names(),
                   help="; ".join(f"{r.name}: {r.summary}" for r in recipes.RECIPES.values()))
    p.add_argument("--epochs", type=T.positive_int, default=1, help="passes over the training set")
    p.add_argument("--lr", type=T.positive_float, default=None,
                   help="default 1e-3, or 5e-5 for text models")
    p.add_argument("--weight-decay", type=T.nonnegative_float, default=0.05,
                   help="AdamW weight decay")
    p.add_argument("--batch-size", type=T.positive_int, default=128, help="training batch size")
    p.add_argument("--seed", type=int, default=0,
                   help="initial weights and data order (the same for every method)")
    p.add_argument("--train-size", type=T.positive_int, default=None,
                   help="fixed random training subset")
    p.add_argument("--test-size", type=T.positive_int, default=None,
                   help="fixed random test subset")
    p.add_argument("--max-steps", type=T.positive_int, default=None,
                   help="stop after N steps (smoke runs)")
    p.add_argument("--image-size", type=T.positive_int, default=None,
                   help="resize images to this square size")
    p.add_argument("--max-len", type=T.sequence_length, default=64,
                   help="tokens per text example (2 or more)")
    p.add_argument("--lora-r", type=T.nonnegative_int, default=0,
                   help="LoRA rank via peft (0 = full training); HOT then applies only to the "
                        "frozen base layers")
    p.add_argument("--lora-alpha", type=T.positive_int, default=16, help="LoRA scaling alpha")
    p.add_argument("--lora-hot", choices=LORA_HOT, default="frozen",
                   help="with --lora-r and a HOT method: which layers run HOT, the frozen base "
                        "layers (the paper's choice), the trained adapters, or both")
    p.add_argument("--vit-dim", type=T.positive_int, default=128,
                   help="tiny-vit width (a multiple of its 4 heads)")
    p.add_argument("--vit-depth", type=T.positive_int, default=6, help="tiny-vit blocks")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--out", default=None,
                   help="output folder (default runs/<model>-<dataset>-<method>)")
    p.add_argument("--resume", default=None, help="checkpoint.pt to continue from (with the "
                   "same --epochs, so that the learning-rate schedule is the same); a finished "
                   "run is left as it is")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="also keep checkpoint-epoch<N>.pt after every epoch")
    p.add_argument("--no-plot", action="store_true", help="do not draw curves.png")
    p.add_argument("--compile", action="store_true",
                   help="train through torch.compile(model) (evaluation runs the model eagerly)")
    p.add_argument("--exclude", type=T.pattern_list, default=(),
                   help="comma-separated layer-name patterns left exact (a name matches when it "
                        "contains the pattern or matches it as a glob, e.g. head or blocks.0.*)")
    add_threads_flag(p)
    add_overwrite_flag(p)
    add_hot_args(p)
    p.add_argument("--hla-full-rank", type=T.name_list, default=(),
                   help="comma-separated parts of layer names (e.g. attn, or qkv,proj) whose g_W "
                        "keeps all 16 coefficients: HLA's low-rank projection off there, its "
                        "INT8 quantization kept (default: none)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.lora_hot != "frozen" and not args.lora_r:
        raise CLIError(f"--lora-hot {args.lora_hot} chooses among LoRA layers: add --lora-r "
                       f"(e.g. --lora-r 8), or drop --lora-hot.")
    apply_threads(args)
    if args.dataset in LM_DATASETS:
        from .lmtrain import run_lm

        return run_lm(args)
    device = device_from(args.device)
    check_backend(args, device)
    cfg = hot_config(args)
    fp = train_fingerprint(args, device.type, cfg.to_dict())
    ck = read_checkpoint(args.resume) if args.resume else None
    if ck is not None and differences(ck.get("fingerprint"), fp):
        if not args.overwrite:
            refuse(f"--resume {args.resume}", ck.get("fingerprint"), fp)
        log(f"--overwrite: {args.resume} is a run of another task; starting over.")
        ck, args.resume = None, None
    if ck is not None and checkpoint_complete(ck, args.epochs, args.max_steps):
        return _already_complete(args, ck)
    name = f"{pathlib.Path(args.model).name}-{args.dataset}-{args.method}"
    out = pathlib.Path(args.out or pathlib.Path("runs") / name)
    _claim_outputs(args, out, ck)
    data = load_dataset(args.dataset, args.data_root, train_size=args.train_size,
                        test_size=args.test_size, seed=args.seed, image_size=args.image_size or 32)
    check_fits(args.model, "--model", data)
    shape = None
    if data.kind == "image":
        shape = (data.shape if not args.image_size else
                 (data.shape[0], args.image_size, args.image_size))
        if args.model == "tiny-vit":
            check_tiny_vit(shape, args.vit_dim, f"--image-size {args.image_size}" if args.image_size
                           else f"--dataset {args.dataset} (pass --image-size)")
    lr = args.lr if args.lr is not None else (5e-5 if data.kind == "text" else 1e-3)
    builder = lambda: build_model(args.model, classes=data.classes, input_shape=shape,
                                  vit_dim=args.vit_dim, vit_depth=args.vit_depth)
    spec = RunSpec(method=args.method, epochs=args.epochs, lr=lr, weight_decay=args.weight_decay,
                   batch_size=args.batch_size, seed=args.seed, hot_config=cfg,
                   backend=args.backend, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                   lora_hot=args.lora_hot, hla_full_rank=args.hla_full_rank,
                   max_len=args.max_len, image_size=args.image_size, max_steps=args.max_steps,
                   checkpoint=str(out / "checkpoint.pt"), resume=args.resume, resume_state=ck,
                   keep_checkpoints=args.keep_checkpoints, fingerprint=fp,
                   compile=args.compile, exclude=args.exclude)
    t0 = time.perf_counter()
    r = train_run(builder, data, spec, device, label=args.method)
    model = r.pop("model")
    layers = hot.hot_layers(model)
    png = out / "curves.png"
    result = {"model": args.model, "dataset": data.name, "data_note": data.note,
              "train_examples": len(data.y_train) if data.kind == "image" else len(data.train),
              "test_examples": len(data.y_test) if data.kind == "image" else len(data.test),
              "lr": lr, "lora_r": args.lora_r,
              "lora_hot": args.lora_hot if args.lora_r else None, "hot_config": cfg.to_dict(),
              "lqs": {n: int(m.hot_lqs) for n, m in layers},
              **rank_record(layers),
              "hot_steps": {n: int(m.hot_step) for n, m in layers}, "out": str(out),
              "fingerprint": fp,
              "wall_time_s": time.perf_counter() - t0,
              "plot": str(png) if not args.no_plot and plots.available() else None, **r}
    # The metrics first: a figure that fails to draw must not cost the results.
    write_text(out / "metrics.json", json.dumps(result, indent=1, default=str))
    write_text(out / "metrics.csv", csv_text(r["history"]["epochs"],
                                             ["epoch", "step", "train_loss", "test_acc"]))
    if not args.no_plot:
        plots.curves([r], png, name)
    text = render_table(["method", "test acc %", "steps", "ms/step", "peak memory",
                         "saved by linears"],
                        [[args.method, f"{100 * r['test_acc']:.2f}", r["steps"],
                          f"{1000 * r['time_per_step_s']:.0f}",
                          fmt_bytes(r["peak_memory_bytes"]), fmt_bytes(r["saved_bytes_linear"])]])
    files = ["metrics.json", "metrics.csv", "checkpoint.pt"] + (["curves.png"] if result["plot"]
                                                                else [])
    text += f"\n\noutputs in {out}/ ({', '.join(files)})"
    emit(args, result, text)
    return 0


def _claim_outputs(args, out: pathlib.Path, ck: Optional[dict]) -> None:
    """Stop before any work if the run would replace results in ``out`` (see outputs.claim);
    the checkpoint being resumed may be replaced, since the run continues it."""
    if (not args.resume and not args.overwrite and (out / "checkpoint.pt").exists()
            and not (out / "metrics.json").exists()):
        raise CLIError(f"--out {out} holds the checkpoint.pt of a run that did not finish; "
                       f"continue it with --resume {out / 'checkpoint.pt'}, or give another "
                       f"--out folder, or --overwrite to start over.")
    start = ck["epoch"] + 1 if ck is not None else 0
    names = ["metrics.json", "metrics.csv", "checkpoint.pt"]
    names += [] if args.no_plot else ["curves.png"]
    if args.keep_checkpoints:
        names += [epoch_checkpoint("checkpoint.pt", e).name
                  for e in range(start + 1, args.epochs + 1)]
    claim(out, names, args.overwrite, keep=[args.resume] if args.resume else [])


def _already_complete(args, ck: dict) -> int:
    """A --resume of a finished run: say so and write nothing (exit status 0)."""
    epochs = ck["history"].get("epochs") or []
    acc = epochs[-1]["test_acc"] if epochs else None
    result = {"status": "already complete", "resume": args.resume, "written": [],
              "epochs_done": ck["epoch"] + 1, "steps": ck["step"], "test_acc": acc,
              "history": ck["history"]}
    limit = (f"--max-steps {args.max_steps}" if args.max_steps is not None
             and ck["step"] >= args.max_steps else f"--epochs {args.epochs}")
    text = (f"nothing to train: {args.resume} is already complete for {limit} (epoch "
            f"{ck['epoch'] + 1}, step {ck['step']}"
            + (f", test accuracy {100 * acc:.2f}%" if acc is not None else "")
            + "); nothing was written.")
    emit(args, result, text)
    return 0

