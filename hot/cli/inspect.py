"""`hot inspect MODEL`: per-layer SQNR, cosine and effective bits of HOT's g_x and g_W."""

from __future__ import annotations

import argparse

import torch

from ..analysis.fidelity import model_fidelity
from ..data import DATASETS, load_dataset
from .common import (CLIError, add_hot_args, add_json_flag, check_backend, device_from, emit,
                     hot_config, progress, render_table)
from .modelargs import add_model_args, build_for_analysis, check_fits, model_kind
from .trainer import Batches

NO_GRADIENT = "no gradient"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect", help="per-layer gradient fidelity of HOT (SQNR, cosine, effective bits, LQS)",
        description="On one batch, record every Linear/Conv2d's input x and output gradient g_y "
        "in an exact backward, then run each layer's HOT backward on the same x and g_y and "
        "compare g_x and g_W with the exact ones. SQNR = 10 log10(|g|^2 / |g_hot - g|^2) dB; "
        "effective bits = SQNR / 6.02 (an ideal uniform quantizer with that SQNR). The LQS "
        "column is the scaling the layer chose for g_y after calibrating on this batch. A "
        "layer whose g_y is exactly zero is shown as such: there is nothing to compare.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    p.add_argument("--dataset", default=None, choices=sorted(DATASETS),
                   help="take the batch from this dataset (hot train's names; default: random "
                        "inputs and labels; real data gives realistic gradients)")
    p.add_argument("--data-root", default=None, help="local data folder for --dataset")
    p.add_argument("--seed", type=int, default=0, help="the batch and the initial weights")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    add_hot_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def _data_shape(args, data) -> tuple:
    """The model's image shape for a dataset batch: --input-shape (the images are resized to
    it) where its channels match the data's, else the data's own shape."""
    if not args.input_shape:
        return tuple(data.shape)
    if args.input_shape[0] != data.shape[0]:
        given = ",".join(map(str, args.input_shape))
        raise CLIError(
            f"--input-shape {given} does not fit --dataset {args.dataset}, whose images are "
            f"{','.join(map(str, data.shape))}; give {data.shape[0]},H,W (the images are "
            f"resized to H x W) or leave --input-shape out.")
    return tuple(args.input_shape)


def run(args) -> int:
    device = device_from(args.device)
    check_backend(args, device)
    cfg = hot_config(args)
    torch.manual_seed(args.seed)
    shape = data = None
    if args.dataset and model_kind(args.model) == "lm":
        raise CLIError(f"MODEL {args.model} is a Llama preset, which inspect runs on random "
                       f"tokens: leave --dataset {args.dataset} out.")
    if args.dataset:
        data = load_dataset(args.dataset, args.data_root, train_size=args.batch, test_size=1,
                            seed=args.seed)
        check_fits(args.model, "MODEL", data)
        args.classes = data.classes
        if data.kind == "image":
            shape = _data_shape(args, data)
    built, shape, make, loss_of = build_for_analysis(args, shape)
    model = built.model.to(device)
    if data is not None:
        size = shape[-1] if data.kind == "image" and tuple(data.shape) != shape else None
        b = Batches(data, "train", device, built.tokenizer, args.seq_len, size)
        x, y = b.get(torch.arange(min(args.batch, len(b))))
    else:
        x, y = make(device, torch.Generator().manual_seed(args.seed))
    rows = model_fidelity(model, lambda m: loss_of(m, x, y), cfg,
                          args.backend, progress=lambda it: progress(it, "inspect layers"))
    table = [_table_row(r) for r in rows]
    silent = [r["layer"] for r in rows if r.get("no_gradient")]
    out = {"model": args.model, "dataset": args.dataset or "random", "batch": args.batch,
           "hot_config": cfg.to_dict(), "layers": rows, "no_gradient_layers": silent,
           "definitions": {"sqnr_db": "10 log10(|g|^2 / |g_hot - g|^2)",
                           "cosine": "<g, g_hot> / (|g| |g_hot|)",
                           "effective_bits": "sqnr_db / 6.02",
                           "no_gradient": "g_y is exactly 0: nothing to compare; the metrics "
                                          "are null"}}
    text = render_table(["layer", "LQS", "g_x SQNR dB", "g_x cos", "g_x bits", "g_W SQNR dB",
                         "g_W cos", "g_W bits"], table)
    if silent:
        text += (f"\n\n{NO_GRADIENT}: no gradient reached {len(silent)} of {len(rows)} layers in "
                 f"this backward (their g_y is exactly 0, e.g. behind a BatchNorm whose weight "
                 f"starts at zero, as in timm's ResNets); there is nothing to compare there.")
    emit(args, out, text)
    return 0


def _table_row(r: dict) -> list:
    if not r["converted"]:
        return [r["layer"], "not converted"] + [""] * 6
    gx, gw = r["g_x"], r["g_W"]
    if r["no_gradient"] and gx["hot_norm"] == 0 and gw["hot_norm"] == 0:
        return [r["layer"], r["lqs"], NO_GRADIENT, "", "", NO_GRADIENT, "", ""]
    return [r["layer"], r["lqs"], *_cells(gx), *_cells(gw)]


def _cells(m: dict) -> list:
    """SQNR, cosine, bits; where the exact gradient is zero, what HOT gave instead."""
    if m["exact_zero"]:
        return ["exact = 0", f"HOT |g| = {m['hot_norm']:.3g}", ""]
    return [m["sqnr_db"], "n/a" if m["cosine"] is None else m["cosine"], m["effective_bits"]]
