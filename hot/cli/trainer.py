"""One image or text classification run: build, prepare for a method, train through the loop
of hot.cli.loop (AdamW, per-step cosine decay, test accuracy per epoch, time per step),
measure memory and saved bytes, checkpoint after every epoch.

Every run of a given seed starts from the same initial weights (torch.manual_seed(seed)
before building) and sees the same data order (a generator seeded with (seed, epoch)), so two
methods differ only in what the method changes.
"""

from __future__ import annotations

import fnmatch
import pathlib
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

import hot

from ..analysis.memory import state_bytes
from ..analysis.saved import SavedTensorMeter
from ..data.base import ImageData, TextData
from . import outputs
from .common import CLIError, log, progress
from .errors import one_line
from .common import method_recipe
from .loop import Epochs, Evaluation, Progress, adamw, fit
from .methods import full_rank


@dataclass
class RunSpec:
    method: str
    epochs: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.05
    batch_size: int = 128
    seed: int = 0
    hot_config: Optional[hot.HOTConfig] = None
    backend: Optional[str] = None
    lora_r: int = 0
    lora_alpha: int = 16
    lora_hot: str = "frozen"  # which LoRA layers run HOT: "frozen", "adapters" or "both"
    hla_full_rank: tuple = ()  # parts of layer names that keep HLA rank 16 (methods.full_rank)
    max_len: int = 64
    image_size: Optional[int] = None
    max_steps: Optional[int] = None  # stop early (smoke runs)
    eval_batch: int = 500
    checkpoint: Optional[str] = None  # path to write after every epoch
    keep_checkpoints: bool = False  # also keep <checkpoint stem>-epoch<N>.pt for every epoch
    resume: Optional[str] = None
    resume_state: Optional[dict] = None  # the checkpoint at ``resume``, if already read
    fingerprint: Optional[dict] = None  # what determines the result (hot.cli.fingerprint)
    compile: bool = False  # train through torch.compile(model)
    exclude: tuple = ()  # layer-name patterns HOT leaves exact (excluded)
    extra: dict = field(default_factory=dict)


CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "epoch", "step", "history", "rng")


def read_checkpoint(path: str) -> dict:
    """The checkpoint that ``hot train`` wrote at ``path`` (for --resume), loaded on the CPU
    with torch.load(weights_only=True): tensors and plain data only, no code runs. CLIError
    when the file is missing, unreadable, or not a hot train checkpoint."""
    fix = "give the checkpoint.pt that an earlier `hot train` wrote."
    p = pathlib.Path(path)
    if not p.is_file():
        raise CLIError(f"--resume {path}: no such file; {fix}")
    try:
        ck = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CLIError(f"--resume {path}: torch.load cannot read it as a checkpoint of tensors "
                       f"and plain data ({type(e).__name__}); {fix}") from e
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise CLIError(f"--resume {path}: not a hot train checkpoint (no "
                       f"{', '.join(missing)}); {fix}")
    return ck


def checkpoint_complete(ck: dict, epochs: int, max_steps: Optional[int]) -> bool:
    """Whether the run that wrote ``ck`` already did all ``epochs`` (or ``max_steps``)."""
    return ck["epoch"] + 1 >= epochs or (max_steps is not None and ck["step"] >= max_steps)


def _restore(ck: dict, path: str, method: str, model, opt, sched) -> None:
    if ck.get("method", method) != method:
        raise CLIError(f"--resume {path} was written with --method {ck['method']}; continue it "
                       f"with --method {ck['method']}.")
    try:
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
    except (RuntimeError, ValueError, KeyError) as e:
        raise CLIError(f"--resume {path}: its state does not fit this model "
                       f"({one_line(str(e))[:300]}); resume with the --model, --vit-dim, "
                       f"--vit-depth, --lora-r and --method of the run that wrote it.") from e
    torch.set_rng_state(ck["rng"])


class Batches:
    """Model-ready batches of a dataset split (tensors on ``device``)."""

    def __init__(self, data, split: str, device, tokenizer=None, max_len: int = 64,
                 image_size: Optional[int] = None):
        self.data, self.device, self.image_size = data, device, image_size
        if isinstance(data, ImageData):
            self.x = data.x_train if split == "train" else data.x_test
            self.y = data.y_train if split == "train" else data.y_test
        elif isinstance(data, TextData):
            rows = data.train if split == "train" else data.test
            enc = tokenizer([t for t, _ in rows], padding="max_length", truncation=True,
                            max_length=max_len, return_tensors="pt")
            self.x = {k: v for k, v in enc.items()}
            self.y = torch.tensor([l for _, l in rows], dtype=torch.int64)
        else:
            raise TypeError(type(data))

    def __len__(self) -> int:
        return len(self.y)

    def get(self, idx: torch.Tensor):
        if isinstance(self.x, dict):
            xb = {k: v[idx].to(self.device) for k, v in self.x.items()}
        else:
            xb = self.data.normalize(self.x[idx])
            if self.image_size and xb.shape[-1] != self.image_size:
                xb = F.interpolate(xb, size=(self.image_size, self.image_size), mode="bilinear",
                                   align_corners=False)
            xb = xb.to(self.device)
        return xb, self.y[idx].to(self.device)


def logits_of(model: nn.Module, xb):
    out = model(**xb) if isinstance(xb, dict) else model(xb)
    return out.logits if hasattr(out, "logits") else out


def apply_lora(model: nn.Module, kind: str, r: int, alpha: int) -> nn.Module:
    """peft LoRA on every Linear except the classifier head, which trains in full."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ValueError("--lora-r needs peft: pip install peft") from e
    head = _head_name(model, kind)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0,
                     target_modules=_lora_targets(model, head), modules_to_save=[head])
    return get_peft_model(model, cfg)


def _head_name(model, kind) -> str:
    if kind == "text":
        return "classifier"
    cfg = getattr(model, "pretrained_cfg", None) or {}
    name = cfg.get("classifier", "head") if isinstance(cfg, dict) else "head"
    return name.split(".")[0]


def _lora_targets(model, head: str) -> list[str]:
    names = set()
    for fqn, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and not fqn.startswith(head):
            names.add(fqn.rsplit(".", 1)[-1])
    if not names:
        raise ValueError("--lora-r: the model has no nn.Linear outside its head to adapt.")
    return sorted(names)


def evaluate(model, batches: Batches, method, device, bs: int, desc: str) -> float:
    model.eval()
    correct = 0
    with torch.no_grad(), method.context(device):
        idx_all = torch.arange(len(batches))
        chunks = list(idx_all.split(bs))
        for idx in progress(chunks, desc):
            xb, yb = batches.get(idx)
            correct += int((logits_of(model, xb).argmax(-1) == yb).sum())
    model.train()
    return correct / max(1, len(batches))


LORA_HOT = ("frozen", "adapters", "both")


def lora_filter(which: str):
    """convert's filter for the LoRA layers that run HOT (the paper's Table 3): the frozen base
    layers (peft's base_layer), the trained low-rank factors (lora_A, lora_B), or both."""
    frozen = lambda fqn: "base_layer" in fqn  # noqa: E731
    adapters = lambda fqn: ".lora_A." in fqn or ".lora_B." in fqn  # noqa: E731
    pick = {"frozen": frozen, "adapters": adapters,
            "both": lambda fqn: frozen(fqn) or adapters(fqn)}[which]
    return lambda fqn, m: pick(fqn)


def prepare_model(builder, spec: RunSpec, device):
    """Seeded build, LoRA, method preparation; returns (model, built)."""
    torch.manual_seed(spec.seed)
    built = builder()
    model = built.model
    if spec.lora_r:
        model = apply_lora(model, built.kind, spec.lora_r, spec.lora_alpha)
    recipe = method_recipe(spec.method)
    if not recipe.exact:
        filt = lora_filter(spec.lora_hot) if spec.lora_r else None
        if spec.exclude:
            filt = exclude_filter(model, spec.exclude, filt)
        cfg = spec.hot_config or recipe.config
        model = recipe.prepare(model, cfg, filt, spec.backend)
        full_rank(model, spec.hla_full_rank, cfg, spec.backend)
    return model.to(device), built


def matches(fqn: str, pattern: str) -> bool:
    """--exclude's rule: ``fqn`` contains ``pattern`` or matches it as a glob."""
    return pattern in fqn or fnmatch.fnmatchcase(fqn, pattern)


def exclude_filter(model: nn.Module, patterns: tuple, base=None):
    """convert's filter that leaves the layers matching ``patterns`` exact (and, with ``base``,
    also those ``base`` rejects); CLIError for a pattern that names no Linear/Conv2d layer."""
    names = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for p in patterns:
        if not any(matches(n, p) for n in names):
            raise CLIError(f"--exclude {p}: no Linear or Conv2d layer name matches it (e.g. "
                           f"{names[-1] if names else 'none'}); give a part of a layer name or a "
                           f"glob.")
    keep = lambda fqn: not any(matches(fqn, p) for p in patterns)  # noqa: E731
    return (lambda fqn, m: keep(fqn) and base(fqn, m)) if base else (lambda fqn, m: keep(fqn))


def backend_summary(model) -> Optional[str]:
    """Which backend the HOT layers ran on ('reference', or 'fast' with its GEMM: CUTLASS where
    the csrc extension is built, else Triton, with why it is not built); None without HOT layers."""
    names = sorted({b for _, m in hot.hot_layers(model) for b in m._hot_resolved.values()})
    if not names:
        return None
    out = []
    for b in names:
        if b == "fast":
            from ..fast import why_extension_unavailable

            why = why_extension_unavailable()
            b = "fast (GEMMs: CUTLASS)" if why is None else f"fast (GEMMs: Triton; CUTLASS {why})"
        out.append(b)
    return ", ".join(out)


def train_run(builder, data, spec: RunSpec, device, label: str = "") -> dict:
    """Train one model; returns metrics (see docs/cli.md for the fields)."""
    method = method_recipe(spec.method)
    label = label or spec.method
    model, built = prepare_model(builder, spec, device)
    # Training steps go through the compiled module; evaluation, the saved-bytes measurement and
    # checkpoints use the model itself (its state_dict keys stay those of the plain model).
    forward = torch.compile(model) if spec.compile else model
    train_b = Batches(data, "train", device, built.tokenizer, spec.max_len, spec.image_size)
    test_b = Batches(data, "test", device, built.tokenizer, spec.max_len, spec.image_size)
    epochs = Epochs(len(train_b), spec.batch_size, spec.epochs, spec.seed, spec.max_steps)
    params = [p for p in model.parameters() if p.requires_grad]
    opt, sched = adamw(params, spec.lr, epochs.total, weight_decay=spec.weight_decay)
    start = Progress()
    if spec.resume:
        ck = spec.resume_state if spec.resume_state is not None else read_checkpoint(spec.resume)
        _restore(ck, spec.resume, spec.method, model, opt, sched)
        start = Progress(ck["epoch"] + 1, ck["step"], ck["history"])
        log(f"[{label}] resumed from {spec.resume} at epoch {start.epoch}, step {start.step}")

    def test_accuracy() -> Evaluation:
        acc = evaluate(model, test_b, method, device, spec.eval_batch, f"{label} eval")
        return Evaluation({"test_acc": acc}, f"test accuracy {100 * acc:.2f}%")

    def checkpoint(epoch: int, state: Progress) -> None:
        ck = {"model": model.state_dict(), "optimizer": opt.state_dict(),
              "scheduler": sched.state_dict(), "epoch": epoch, "step": state.step,
              "history": state.history, "rng": torch.get_rng_state(),
              "method": spec.method, "epochs": spec.epochs, "max_steps": spec.max_steps,
              "hot_config": (spec.hot_config or hot.HOTConfig()).to_dict(),
              "fingerprint": spec.fingerprint}
        outputs.save(ck, spec.checkpoint)
        if spec.keep_checkpoints:
            outputs.save(ck, epoch_checkpoint(spec.checkpoint, epoch + 1))

    done = fit(model, opt, sched, epochs, batch=train_b.get,
               loss=lambda b: F.cross_entropy(logits_of(forward, b[0]).float(), b[1]),
               evaluate=test_accuracy, context=lambda: method.context(device), device=device,
               label=label, advice="try a lower --lr, or --exact-steps for a warm-up",
               start=start, on_epoch=checkpoint if spec.checkpoint else None)
    history, peak = done.progress.history, done.peak_memory_bytes
    mem = measure_saved(model, train_b, method, device, spec.batch_size)
    st = state_bytes(model)
    result = {
        "label": label, "method": spec.method, "device": str(device),
        "test_acc": history["epochs"][-1]["test_acc"] if history["epochs"] else None,
        "steps": done.progress.step, "time_per_step_s": done.median_step_s,
        "peak_memory_bytes": peak,
        "peak_memory_source": "torch.cuda.max_memory_allocated" if peak is not None else
        "accounting: weights + gradients + AdamW state + all tensors saved for backward",
        "saved_bytes_linear": mem["linear"], "saved_bytes_total": mem["total"],
        "saved_bytes_by_layer": mem["by_layer"], **st,
        "history": history,
        "hot_layers": len(hot.hot_layers(model)),
        "hot_backend": backend_summary(model),
    }
    if result["hot_backend"]:
        log(f"[{label}] HOT backend: {result['hot_backend']}")
    if peak is None:
        result["peak_memory_bytes"] = (st["weights"] + st["gradients"] + st["optimizer"]
                                       + mem["total"])
    result["model"] = model
    return result


def epoch_checkpoint(checkpoint: str, epoch: int) -> pathlib.Path:
    """Where --keep-checkpoints keeps the checkpoint after ``epoch`` (1-based)."""
    p = pathlib.Path(checkpoint)
    return p.with_name(f"{p.stem}-epoch{epoch}{p.suffix}")


def measure_saved(model, batches: Batches, method, device, bs: int) -> dict:
    """Saved-for-backward bytes of one training forward (first batch), graph then discarded.
    No backward runs, so HOT's step counters and LQS state are untouched."""
    idx = torch.arange(min(bs, len(batches)))
    xb, yb = batches.get(idx)
    with SavedTensorMeter(model) as m, method.context(device):
        loss = F.cross_entropy(logits_of(model, xb).float(), yb)
    del loss
    return {"linear": m.layer_total, "total": m.total, "by_layer": dict(m.by_layer)}

