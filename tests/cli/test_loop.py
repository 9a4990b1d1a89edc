"""The one training loop (hot.cli.loop) behind train_run (images, text) and train_lm: each caller
takes the very steps of a plain AdamW loop written out here, loss for loss, metric for metric."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from hot import recipes
from hot.cli import loop
from hot.cli.trainer import Batches, RunSpec, evaluate, logits_of, prepare_model, train_run
from hot.data import load_dataset
from hot.models.registry import build_model


def factor(step, total, warmup):
    """Linear warm-up to 1, then a cosine to 0 at ``total`` (the schedule both tasks document)."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, span) / span))


def manual(model, groups, lr, betas, clip, warmup, examples, bs, epochs, seed, max_steps, batch,
           loss_of, evaluate_fn, context):
    """A plain training loop: (step losses, per-epoch metric)."""
    opt = torch.optim.AdamW(groups, lr=lr, betas=betas)
    total = min(math.ceil(examples / bs) * epochs, max_steps or 10 ** 9)
    losses, metrics = [], []
    model.train()
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(seed * 1000 + epoch)
        for idx in torch.randperm(examples, generator=g).split(bs):
            if len(losses) == total:
                break
            for group in opt.param_groups:
                group["lr"] = lr * factor(len(losses), total, warmup)
            with context():
                loss = loss_of(batch(idx))
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        metrics.append(evaluate_fn())
        if len(losses) == total:
            break
    return losses, metrics


@pytest.mark.parametrize("method", ["fp32", "hot"])
def test_train_run_takes_the_steps_of_a_plain_loop(method):
    data = load_dataset("mnist-5k", None, train_size=96, test_size=64, seed=0, image_size=32)

    def builder():
        return build_model("tiny-vit", classes=data.classes, input_shape=data.shape, vit_dim=32,
                           vit_depth=1)

    # 3 steps an epoch, the last batch short; max_steps ends the run inside the second epoch.
    spec = RunSpec(method=method, epochs=3, batch_size=40, seed=3, max_steps=5, lr=3e-3,
                   weight_decay=0.05)
    cpu = torch.device("cpu")
    r = train_run(builder, data, spec, cpu)

    model, _ = prepare_model(builder, spec, cpu)
    train_b, test_b = Batches(data, "train", cpu), Batches(data, "test", cpu)
    recipe = recipes.get(method)
    groups = [{"params": [p for p in model.parameters() if p.requires_grad],
               "weight_decay": spec.weight_decay}]
    losses, accs = manual(
        model, groups, spec.lr, (0.9, 0.999), None, 0, len(train_b), spec.batch_size, spec.epochs,
        spec.seed, spec.max_steps, train_b.get,
        lambda b: F.cross_entropy(logits_of(model, b[0]).float(), b[1]),
        lambda: evaluate(model, test_b, recipe, cpu, spec.eval_batch, ""),
        lambda: recipe.context(cpu))
    assert r["steps"] == 5 and len(r["history"]["epochs"]) == 2
    assert r["history"]["step_loss"] == losses
    assert [e["test_acc"] for e in r["history"]["epochs"]] == accs


@pytest.mark.parametrize("method", ["fp32", "hot"])
def test_train_lm_takes_the_steps_of_a_plain_loop(method):
    pytest.importorskip("transformers")
    from hot.cli.lmtrain import LMSpec, lm_loss, perplexity, train_lm
    from hot.data.lm import rotten_tomatoes_lm
    from hot.models.registry import build_lm

    small = {"layers": 1, "hidden": 64, "heads": 2, "ffn": 128}
    # 3 steps an epoch (the last one short), 2 epochs; a warm-up and a clip that bites at lr 2e-2.
    spec = LMSpec(method=method, model_overrides=small, train_size=40, val_size=32, batch_size=16,
                  seq=32, lr=2e-2, warmup_steps=2, epochs=2, seed=2, grad_clip=0.5)
    data = rotten_tomatoes_lm()
    r = train_lm(spec, "cpu", data)

    sub = data.subset(spec.train_size, spec.val_size, seed=0)
    train_b, val_b = sub.encode("train", spec.seq), sub.encode("test", spec.seq)
    torch.manual_seed(spec.seed)
    model = build_lm(spec.model, vocab=sub.vocab, seq=spec.seq, pad_id=sub.pad_id,
                     overrides=small).model
    recipe = recipes.get(method)
    if not recipe.exact:
        model = recipe.prepare(model, recipe.config, lambda fqn, m: True, None)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2],
               "weight_decay": spec.weight_decay},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    cpu = torch.device("cpu")
    losses, ppls = manual(
        model, groups, spec.lr, spec.betas, spec.grad_clip, spec.warmup_steps, len(train_b),
        spec.batch_size, spec.epochs, spec.seed, None, lambda idx: train_b.get(idx, cpu),
        lambda b: lm_loss(model, *b),
        lambda: perplexity(model, val_b, cpu, recipe.context(cpu), spec.eval_batch)[0],
        lambda: recipe.context(cpu))
    assert r["steps"] == 6 and len(losses) == 6
    assert r["history"]["step_loss"] == losses
    assert [e["val_ppl"] for e in r["history"]["epochs"]] == ppls and r["val_ppl"] == ppls[-1]


def test_the_batches_of_a_run_cover_each_epoch_once_and_stop_at_max_steps():
    e = loop.Epochs(examples=10, batch_size=4, epochs=3, seed=1, max_steps=7)
    assert e.total == 7 and loop.Epochs(10, 4, 3, 1).total == 9
    first = e.batches(0, 0)
    assert [len(b) for b in first] == [4, 4, 2]
    assert sorted(torch.cat(first).tolist()) == list(range(10))
    assert [len(b) for b in e.batches(2, 6)] == [4]  # one step left of max_steps
    assert not torch.equal(torch.cat(e.batches(1, 3)), torch.cat(first))  # reshuffled


def test_a_loss_that_is_not_finite_names_the_step_and_the_advice():
    model = torch.nn.Linear(2, 1)
    opt, sched = loop.adamw(model.parameters(), 1e-3, total=4)
    ones = torch.ones(1, 2)
    with pytest.raises(FloatingPointError, match=r"\[m\] loss is nan at step 0: .*lower it"):
        loop.fit(model, opt, sched, loop.Epochs(4, 2, 1, 0), batch=lambda idx: ones,
                 loss=lambda b: model(b).sum() * float("nan"),
                 evaluate=lambda: loop.Evaluation({}, ""), context=contextlib.nullcontext,
                 device=torch.device("cpu"), label="m", advice="lower it")
