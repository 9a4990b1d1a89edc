"""The one training loop of ``hot train``: image and text classification (hot.cli.trainer) and
causal language models (hot.cli.lmtrain) differ only in what they pass in, the batches, the loss,
the evaluation, the parameter groups and the schedule's warm-up.

A step: the loss under the recipe's autocast context, backward, optional gradient clipping,
AdamW step, learning-rate step, gradients freed (set to None) before the next forward. The batch
order of epoch ``e`` is a permutation drawn from a generator seeded with ``seed * 1000 + e``, so
every run of one seed sees the same batches whatever the method, and a resumed run the batches
the uninterrupted run would have seen.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, NamedTuple, Optional

import torch
import torch.nn as nn

from .common import log, progress


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (so that a host clock times the step itself)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def lr_factor(step: int, total: int, warmup: int = 0) -> float:
    """The learning-rate multiplier before optimizer step ``step`` (0-based) of ``total``:
    (step + 1) / warmup during the warm-up, then a cosine from 1 down to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, span) / span))


def adamw(groups, lr: float, total: int, warmup: int = 0, **kw):
    """AdamW over ``groups`` (parameters or parameter groups; ``kw``: weight_decay, betas) and
    its per-step schedule lr_factor(step, total, warmup): (optimizer, scheduler)."""
    opt = torch.optim.AdamW(groups, lr=lr, **kw)
    # A lambda, not a callable object: LambdaLR's state_dict (the checkpoint) then holds no
    # copy of the schedule's arguments, only its step.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, total, warmup))
    return opt, sched


class Epochs(NamedTuple):
    """Which examples each step trains on: ``examples`` in batches of ``batch_size`` for
    ``epochs`` epochs, at most ``max_steps`` steps in all."""

    examples: int
    batch_size: int
    epochs: int
    seed: int
    max_steps: Optional[int] = None

    @property
    def total(self) -> int:
        """Optimizer steps of the whole run (what the schedule spans)."""
        total = math.ceil(self.examples / self.batch_size) * self.epochs
        return min(total, self.max_steps) if self.max_steps else total

    def batches(self, epoch: int, done: int) -> list[torch.Tensor]:
        """The index batches of ``epoch`` (0-based) that remain after ``done`` steps in all."""
        g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
        perm = torch.randperm(self.examples, generator=g)
        return list(perm.split(self.batch_size))[: self.total - done]


class Evaluation(NamedTuple):
    """What an evaluation at the end of an epoch gives the loop."""

    record: dict  # the keys the epoch's history entry gets, e.g. {"test_acc": 0.9}
    message: str  # the log line's end, e.g. "test accuracy 90.00%"
    detail: dict = {}  # more for the caller's result (kept only from the last evaluation)


@dataclass
class Progress:
    """Where a run stands: the next epoch, the steps done, the history so far (a checkpoint's
    values when resuming)."""

    epoch: int = 0
    step: int = 0
    history: dict = field(default_factory=lambda: {"step_loss": [], "epochs": []})


@dataclass
class Fit:
    """A finished loop: its progress, the host time of every step, the last evaluation (None
    when no epoch ran) and the CUDA allocator's peak (None off CUDA)."""

    progress: Progress
    step_times: list
    evaluation: Optional[Evaluation]
    peak_memory_bytes: Optional[int]

    @property
    def median_step_s(self) -> Optional[float]:
        # The median: on a GPU the first call of every new shape (the last, smaller batch of an
        # epoch included) compiles Triton kernels, seconds that a mean would spread over the run.
        times = sorted(self.step_times)
        return times[len(times) // 2] if times else None


def fit(model: nn.Module, opt, sched, epochs: Epochs, *, batch: Callable[[torch.Tensor], Any],
        loss: Callable[[Any], torch.Tensor], evaluate: Callable[[], Evaluation],
        context: Callable[[], ContextManager], device: torch.device, label: str,
        advice: str, clip: Optional[float] = None, start: Optional[Progress] = None,
        on_epoch: Optional[Callable[[int, Progress], None]] = None) -> Fit:
    """Train ``model`` for ``epochs`` from ``start``.

    batch(indices) -> a batch on ``device``; loss(batch) -> the scalar training loss, computed
    under context() (the recipe's autocast); clip: the gradients' global norm is clipped to it;
    evaluate() at the end of every epoch; on_epoch(epoch, progress) after it (checkpoints).
    FloatingPointError, naming the step and ``advice``, when a loss is not finite.
    """
    state = start or Progress()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, evaluation = [], None
    model.train()
    for epoch in range(state.epoch, epochs.epochs):
        if state.step >= epochs.total:
            break
        chunks = epochs.batches(epoch, state.step)
        bar = progress(chunks, f"{label} epoch {epoch + 1}/{epochs.epochs}")
        for idx in bar:
            b = batch(idx)
            sync(device)
            t0 = time.perf_counter()
            with context():
                lv = loss(b)
            lv.backward()
            if clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            sync(device)
            times.append(time.perf_counter() - t0)
            value = float(lv.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"[{label}] loss is {value} at step {state.step}: "
                                         f"training diverged ({advice}).")
            state.history["step_loss"].append(value)
            state.step += 1
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{value:.3f}")
        evaluation = evaluate()
        recent = state.history["step_loss"][-len(chunks):]
        state.history["epochs"].append({"epoch": epoch + 1, "step": state.step,
                                        **evaluation.record,
                                        "train_loss": sum(recent) / len(recent) if recent
                                        else None})
        log(f"[{label}] epoch {epoch + 1}: {evaluation.message}")
        state.epoch = epoch + 1
        if on_epoch is not None:
            on_epoch(epoch, state)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Fit(state, times, evaluation, peak)
