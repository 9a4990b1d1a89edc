"""Causal language-model training from scratch: a Llama preset (random init) on the Rotten
Tomatoes snippets (hot.data.lm), scored by validation perplexity.

Python: ``train_lm(LMSpec(...), device)`` returns the metrics, ``val_ppl`` among them; a study
calls it for many configs and seeds. CLI: ``hot train --model llama-tiny --dataset
rotten-tomatoes-lm`` (``run_lm``).

Every run of a given seed starts from the same weights (torch.manual_seed(seed) before the
build) and sees the same batches (a generator seeded with (seed, epoch)); the subsets and the
validation split do not depend on the seed. So two methods of one seed differ only in what the
method changes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import hot
from hot import recipes

from ..data import load_dataset
from ..data.lm import IGNORE, LMData, TokenBatches, rotten_tomatoes_lm
from ..models.llama import LLAMA_PRESETS
from ..models.registry import build_lm, is_lm_spec
from .common import (CLIError, device_from, emit, fmt_bytes, hot_config, method_recipe,
                     progress, render_table)
from .methods import full_rank, rank_record
from .fingerprint import train_fingerprint
from .loop import Epochs, Evaluation, adamw, fit
from .outputs import claim, csv_text, save, write_text
from .trainer import backend_summary


@dataclass(frozen=True)
class LMSpec:
    """One language-model run.

    method: the name of a recipe (hot.recipes: fp32, bf16, hot, hot-bf16, ...).
    model: a Llama preset (hot.models.llama.LLAMA_PRESETS); ``model_overrides`` replace its
        shapes (e.g. {"layers": 2}); the vocabulary is the tokenizer's, positions ``seq``.
    seq: tokens per snippet (longer ones are truncated; 64 keeps all but 7 of 12,752 whole).
    lr, weight_decay, betas: AdamW; weight decay applies to matrices and embeddings only,
        not to the RMSNorm weights. The learning rate rises linearly over ``warmup_steps``,
        then follows a cosine to 0 at the last step.
    grad_clip: the gradients' global norm is clipped to this (None: not clipped).
    hot_config / backend: for the HOT methods (default: the recipe's own config);
        ``exact_layers`` names Linear layers HOT leaves exact (e.g. ("lm_head",)).
    train_size / val_size: fixed random subsets (seed 0 and 1, whatever ``seed`` is).
    max_steps: stop after this many steps (the schedule then spans them).
    """

    method: str = "hot"
    model: str = "llama-tiny"
    model_overrides: dict = field(default_factory=dict)
    epochs: int = 1
    batch_size: int = 32
    seq: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    warmup_steps: int = 0
    grad_clip: Optional[float] = 1.0
    seed: int = 0
    hot_config: Optional[hot.HOTConfig] = None
    backend: Optional[str] = None
    exact_layers: tuple = ()
    hla_full_rank: tuple = ()  # parts of layer names that keep HLA rank 16 (methods.full_rank)
    train_size: Optional[int] = None
    val_size: Optional[int] = None
    max_steps: Optional[int] = None
    eval_batch: int = 128

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        cfg = self.hot_config or recipes.get(self.method).config or hot.HOTConfig()
        d["hot_config"] = cfg.to_dict()
        return d

    def check(self) -> None:
        """ValueError naming the first field out of range."""
        if self.method not in recipes.RECIPES:
            raise ValueError(f"LMSpec.method={self.method!r}: choose one of "
                             f"{', '.join(recipes.names())}.")
        for name in ("epochs", "batch_size", "eval_batch"):
            if getattr(self, name) <= 0:
                raise ValueError(f"LMSpec.{name}={getattr(self, name)}: must be positive.")
        for name in ("max_steps", "train_size", "val_size"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"LMSpec.{name}={v}: must be positive (or None for all).")
        if self.seq < 2:
            raise ValueError(f"LMSpec.seq={self.seq}: a causal LM needs at least 2 tokens.")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"LMSpec.lr={self.lr}: must be a positive finite number.")
        if self.warmup_steps < 0:
            raise ValueError(f"LMSpec.warmup_steps={self.warmup_steps}: must be 0 or more.")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"LMSpec.grad_clip={self.grad_clip}: must be positive or None.")


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, reduction: str = "mean"):
    """Next-token cross-entropy of ``model`` on inputs ``x``, targets ``y`` (IGNORE excluded),
    computed in float32 from the logits."""
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), ignore_index=IGNORE,
                           reduction=reduction)


def perplexity(model: nn.Module, batches: TokenBatches, device, context, bs: int = 128,
               desc: str = "") -> tuple[float, float, int]:
    """(exp(mean NLL), mean NLL, tokens) of ``model`` over all of ``batches``: the NLL of every
    predicted token summed in float64, padding excluded, under ``context`` (the method's
    autocast). The model is left in training mode."""
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), context:
        for idx in progress(list(torch.arange(len(batches)).split(bs)), desc):
            x, y = batches.get(idx, device)
            total += float(lm_loss(model, x, y, reduction="sum").double())
            count += int((y != IGNORE).sum())
    model.train()
    nll = total / max(1, count)
    return math.exp(nll) if math.isfinite(nll) else nll, nll, count


def train_lm(spec: LMSpec = LMSpec(), device="cpu", data: Optional[LMData] = None,
             label: str = "", keep_model: bool = False) -> dict:
    """Train ``spec`` on ``device`` from scratch; the metrics. ``data`` (default: hot.data.lm
    .rotten_tomatoes_lm(), read from the installed wheels) can be loaded once and passed to
    many runs. ``keep_model`` adds the trained model under "model" (else it is freed).

    Returns: val_ppl (exp of the mean token NLL over the validation set after the last epoch,
    padding excluded), val_nll, val_tokens, uniform_ppl (the vocabulary size: the perplexity of
    uniform predictions), history {step_loss: [...], epochs: [{epoch, step, train_loss,
    val_ppl}]}, steps, time_per_step_s (median), peak_memory_bytes (CUDA only, else None),
    params, hot_layers, hot_backend, method, device, spec, train_sequences, val_sequences.
    Raises FloatingPointError when a training loss is not finite.
    """
    spec.check()
    device = torch.device(device)
    label = label or spec.method
    method = method_recipe(spec.method)
    data = (data or rotten_tomatoes_lm()).subset(spec.train_size, spec.val_size, seed=0)
    train_b, val_b = data.encode("train", spec.seq), data.encode("test", spec.seq)
    torch.manual_seed(spec.seed)
    model = build_lm(spec.model, vocab=data.vocab, seq=spec.seq, pad_id=data.pad_id,
                     overrides=spec.model_overrides).model
    if not method.exact:
        _check_names(model, spec.exact_layers)
        keep = set(spec.exact_layers)
        cfg = spec.hot_config or method.config
        model = method.prepare(model, cfg, lambda fqn, _: fqn not in keep, spec.backend)
        full_rank(model, spec.hla_full_rank, cfg, spec.backend)
    model = model.to(device)
    epochs = Epochs(len(train_b), spec.batch_size, spec.epochs, spec.seed, spec.max_steps)
    opt, sched = adamw(_param_groups(model, spec.weight_decay), spec.lr, epochs.total,
                       spec.warmup_steps, betas=spec.betas)

    def validation() -> Evaluation:
        ppl, nll, n = perplexity(model, val_b, device, method.context(device), spec.eval_batch,
                                 f"{label} validation")
        return Evaluation({"val_ppl": ppl}, f"validation perplexity {ppl:.2f}",
                          {"val_ppl": ppl, "val_nll": nll, "val_tokens": n})

    done = fit(model, opt, sched, epochs, batch=lambda idx: train_b.get(idx, device),
               loss=lambda b: lm_loss(model, *b), evaluate=validation,
               context=lambda: method.context(device), device=device, label=label,
               advice="try a lower lr, or warmup_steps", clip=spec.grad_clip)
    last = done.evaluation.detail if done.evaluation else dict.fromkeys(
        ("val_ppl", "val_nll", "val_tokens"))
    return {
        "label": label, "method": spec.method, "device": str(device), **last,
        "uniform_ppl": data.vocab, "history": done.progress.history,
        "steps": done.progress.step, "time_per_step_s": done.median_step_s,
        "peak_memory_bytes": done.peak_memory_bytes,
        "params": sum(p.numel() for p in model.parameters()),
        "hot_layers": len(hot.hot_layers(model)), "hot_backend": backend_summary(model),
        **rank_record(hot.hot_layers(model)),
        "spec": spec.to_dict(), "train_sequences": len(train_b), "val_sequences": len(val_b),
        **({"model": model} if keep_model else {}),
    }


def _check_names(model: nn.Module, names) -> None:
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    for n in names:
        if n not in linears:
            raise ValueError(f"LMSpec.exact_layers: {n!r} is not a Linear layer of the model "
                             f"(e.g. 'lm_head', 'model.layers.0.mlp.down_proj').")


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    # Decay the matrices (Linear weights, the embedding); norm weights are scales, not features.
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def run_lm(args) -> int:
    """``hot train`` on a language-model dataset: metrics.json, metrics.csv (per epoch) and
    model.pt (the trained weights and the spec) in the output folder."""
    if not is_lm_spec(args.model):
        raise CLIError(f"--dataset {args.dataset} trains a causal language model: pass --model "
                       f"with a Llama preset ({', '.join(sorted(LLAMA_PRESETS))}), not "
                       f"{args.model!r}.")
    if args.lora_r:
        raise CLIError("--lora-r: LoRA adapts pretrained weights; a language model here trains "
                       "from scratch. Drop --lora-r.")
    if args.resume:
        raise CLIError("--resume: language-model runs cannot be resumed yet; start a new run.")
    for flag, on in (("--compile", args.compile), ("--exclude", args.exclude)):
        if on:
            raise CLIError(f"{flag}: not available for language-model runs (from Python, "
                           f"LMSpec.exact_layers leaves layers exact); drop {flag}.")
    spec = LMSpec(method=args.method, model=args.model, epochs=args.epochs,
                  batch_size=args.batch_size, seq=args.max_len,
                  lr=args.lr if args.lr is not None else 1e-3,
                  weight_decay=args.weight_decay, seed=args.seed, hot_config=hot_config(args),
                  backend=args.backend, train_size=args.train_size, val_size=args.test_size,
                  max_steps=args.max_steps, hla_full_rank=args.hla_full_rank)
    device = device_from(args.device)
    fp = train_fingerprint(args, device.type, spec.to_dict()["hot_config"])
    out = pathlib.Path(args.out or pathlib.Path("runs") /
                       f"{args.model}-{args.dataset}-{args.method}")
    # Stop before any work where the run would replace an earlier run's results. The folder is
    # created by the first write (outputs.atomic), so a run that fails leaves none behind.
    claim(out, ["metrics.json", "metrics.csv", "model.pt"], args.overwrite)
    data = load_dataset(args.dataset, args.data_root)
    t0 = time.perf_counter()
    r = train_lm(spec, device, data, label=args.method, keep_model=True)
    model = r.pop("model")
    save({"model": model.state_dict(), "spec": r["spec"]}, out / "model.pt")
    result = {"model": args.model, "dataset": args.dataset, "out": str(out),
              "wall_time_s": time.perf_counter() - t0, "fingerprint": fp, **r}
    write_text(out / "metrics.json", json.dumps(result, indent=1, default=str))
    write_text(out / "metrics.csv", csv_text(r["history"]["epochs"],
                                             ["epoch", "step", "train_loss", "val_ppl"]))
    text = render_table(["method", "val perplexity", "uniform", "steps", "ms/step",
                         "peak memory"],
                        [[args.method, r["val_ppl"], r["uniform_ppl"], r["steps"],
                          f"{1000 * r['time_per_step_s']:.0f}" if r["time_per_step_s"] else "",
                          fmt_bytes(r["peak_memory_bytes"])]])
    text += f"\n\noutputs in {out}/ (metrics.json, metrics.csv, model.pt)"
    emit(args, result, text)
    return 0
