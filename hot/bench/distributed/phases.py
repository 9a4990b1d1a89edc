"""What the worker processes run, one phase at a time: loss curves, timed steps, a checkpoint
round trip, and a step with a zero or NaN g_y on rank 1.

Every phase is a function ``(ctx, phase) -> dict`` run by every rank of the process group; the
dict of rank 0 is the phase's result (ranks' values are all-gathered into it where they matter).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

import hot

KINDS = ("curve", "speed", "checkpoint", "poison")


@dataclass(frozen=True)
class Phase:
    """One unit of work of a block. kind: one of KINDS; method: 'bf16' (no HOT) or 'hot';
    config: the HOTConfig of a HOT model, 'paper' (HOTConfig(seed=seed)) or 'exact';
    wrapper: 'none' (a plain model, one process only), 'ddp' or 'fsdp2'; case: for 'poison',
    'zero' (rank 1's loss times 0) or 'nan' (a NaN in one layer's g_y on rank 1)."""

    kind: str
    workload: str
    wrapper: str = "none"
    method: str = "hot"
    config: str = "paper"
    seed: int = 0
    case: str = ""

    @property
    def name(self) -> str:
        m = self.method if self.method == "bf16" else f"hot/{self.config}"
        if self.config == "paper" and self.method == "hot" and self.kind == "curve":
            m += f"/seed{self.seed}"
        extra = f" {self.case}_gy" if self.case else ""
        return f"{self.kind} {self.workload} {m} {self.wrapper}{extra}"

    def hot_config(self) -> hot.HOTConfig:
        return hot.HOTConfig.exact() if self.config == "exact" else hot.HOTConfig(seed=self.seed)


class Trainer:
    """A (possibly wrapped) model with its optimizer, and one training step of it."""

    def __init__(self, ctx, phase: Phase, config=None, raw=None):
        """config: the HOTConfig (default: the phase's); raw: a model built already (HOT
        layers and all) to wrap instead of a new one."""
        self.ctx, self.phase = ctx, phase
        self.wl = ctx.workload(phase.workload)
        dev = ctx.device
        if raw is None:
            raw = build(ctx, phase, config)
        self.init_checksum = float(sum(p.detach().double().sum() for p in raw.parameters()))
        self.raw = raw
        self.sharded = phase.wrapper == "fsdp2"
        self.model = wrap(ctx, raw, self.wl, phase.wrapper)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=ctx.opts.lr(phase.workload),
                                     weight_decay=0.01, fused=dev.type == "cuda")
        # bf16 autocast on a GPU; the exact check runs in float32 (so that its tolerance can be
        # float32's), and the CPU always does.
        self.amp = dev.type == "cuda" and phase.config != "exact"

    def step(self, batch, loss_scale: float = 1.0, norm: bool = False,
             skip_nonfinite: bool = False):
        """One step: forward, backward, optimizer. Returns (loss, gradient norm or None, whether
        the optimizer stepped). skip_nonfinite: no optimizer step when a gradient holds NaN/Inf
        (as AMP's GradScaler does on an overflow step)."""
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if self.amp \
            else contextlib.nullcontext()
        with ctx:
            loss = self.wl.loss(self.model, batch)
        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        gn = grad_norm(self.model, self.sharded) if norm else None
        stepped = True
        if skip_nonfinite:
            stepped = bool(torch.stack([torch.isfinite(_local(p.grad)).all()
                                        for p in self.model.parameters()
                                        if p.grad is not None]).all())
        if stepped:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach(), gn, stepped

    def batches(self, n: int, per_rank: int):
        """The batches of n steps: each step's global batch of per_rank * world examples, this
        rank's slice of it, already on the device."""
        c = self.ctx
        size = per_rank * c.world
        return [self.wl.batch_at(i, size, c.rank * per_rank, (c.rank + 1) * per_rank, c.device)
                for i in range(n)]


def build(ctx, phase: Phase, config=None) -> nn.Module:
    """The phase's model from the fixed seed, with HOT layers for method 'hot'."""
    raw = ctx.workload(phase.workload).build(ctx.device, ctx.opts.init_seed)
    if phase.method == "hot":
        hot.convert(raw, config or phase.hot_config(), convert_head=True, backend=ctx.opts.backend)
    return raw


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def grad_norm(model: nn.Module, sharded: bool) -> torch.Tensor:
    """The 2-norm of the whole gradient (float64); FSDP2's shards are summed over the ranks."""
    sq = sum(torch.linalg.vector_norm(_local(p.grad), dtype=torch.float64) ** 2
             for p in model.parameters() if p.grad is not None)
    if sharded and dist.get_world_size() > 1:
        dist.all_reduce(sq)
    return sq.sqrt()


def wrap(ctx, model: nn.Module, wl, wrapper: str) -> nn.Module:
    if wrapper == "none":
        return model
    if wrapper == "ddp":
        ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    from torch.distributed.fsdp import fully_shard

    if ctx.world > 1:
        # fully_shard keeps each rank's own slice of its own tensors: make them rank 0's (DDP
        # broadcasts by itself). Same seed, same GPU model: they are equal already.
        for t in model.state_dict().values():
            dist.broadcast(t, 0)
    mesh = ctx.mesh()
    for b in wl.blocks(model):
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def layer_states(model: nn.Module) -> list[list[int]]:
    """Per HOT layer: [hot_lqs buffer, its Python mirror, hot_step buffer, its mirror]."""
    return [[int(m.hot_lqs), m.hot_lqs_value(), int(m.hot_step), m.hot_step_value()]
            for _, m in hot.hot_layers(model)]


def gather(obj) -> list:
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------------


def curve(ctx, ph: Phase) -> dict:
    """``steps`` (``exact_steps`` for the exact config) training steps on fixed global batches
    of 2 * the per-GPU batch, each rank taking its slice: the mean loss and the gradient norm
    of the whole global batch at every step, and (HOT) every rank's LQS decisions at the end."""
    tr = Trainer(ctx, ph)
    n = ctx.opts.exact_steps if ph.config == "exact" else ctx.opts.steps
    per_rank = 2 * tr.wl.batch // ctx.world
    losses, norms = [], []
    for b in tr.batches(n, per_rank):
        loss, gn, _ = tr.step(b, norm=True)
        losses.append(loss.double())
        norms.append(gn)
    # The losses of the ranks' equal slices average to the global batch's loss.
    total = torch.stack(losses)
    if ctx.world > 1:
        dist.all_reduce(total)
    total /= ctx.world
    out = {"losses": total.tolist(), "grad_norms": torch.stack(norms).tolist(),
           "global_batch": 2 * tr.wl.batch, "init_checksum": tr.init_checksum,
           "data": tr.wl.note}
    if ph.method == "hot":
        out["layer_states"] = gather(layer_states(tr.raw))  # one list per rank
    return out


def speed(ctx, ph: Phase) -> dict:
    """Median step time after warm-up (CUDA events on a GPU, wall clock on CPU), throughput of
    the whole world, and every rank's peak allocated memory."""
    o = ctx.opts
    base = torch.cuda.memory_allocated(ctx.device) if ctx.device.type == "cuda" else None
    tr = Trainer(ctx, ph)
    bs = tr.batches(o.warmup + o.timed, tr.wl.batch)
    losses = [tr.step(b)[0] for b in bs[:o.warmup]]
    cuda = ctx.device.type == "cuda"
    sync(ctx.device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    times = []
    for b in bs[o.warmup:]:
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            losses.append(tr.step(b)[0])
            e1.record()
            sync(ctx.device)
            times.append(e0.elapsed_time(e1))
        else:
            t0 = time.perf_counter()
            losses.append(tr.step(b)[0])
            times.append(1000 * (time.perf_counter() - t0))
    # What earlier phases left allocated (nothing, unless something leaks) is not this one's.
    peak = torch.cuda.max_memory_allocated(ctx.device) - base if cuda else None
    per_rank = gather({"median_ms": statistics.median(times), "min_ms": min(times),
                       "peak_bytes": peak, "allocated_before_bytes": base})
    slowest = max(r["median_ms"] for r in per_rank)
    return {"step_ms": slowest, "ranks": per_rank, "batch_per_gpu": tr.wl.batch,
            "throughput": ctx.world * tr.wl.units / (slowest / 1000), "unit": tr.wl.unit,
            "losses": [float(v) for v in losses], "data": tr.wl.note,
            "timer": "cuda events" if cuda else "wall clock (CPU: not a benchmark)"}


def _param_checksum(model: nn.Module, sharded: bool) -> float:
    s = sum(_local(p.detach()).double().sum() for p in model.parameters())
    if sharded and dist.get_world_size() > 1:
        dist.all_reduce(s)
    return float(s)


def checkpoint(ctx, ph: Phase) -> dict:
    """Train until LQS has decided, save (DDP: rank 0 saves module.state_dict(); FSDP2:
    torch.distributed.checkpoint of the sharded state dict), build a fresh model in the same
    processes, load, and compare every HOT layer's LQS decision and step counter (buffers and
    their Python mirrors) and the parameters on every rank; then train one more step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    tr = Trainer(ctx, ph)
    n = ph.hot_config().lqs.calibration_steps + 1
    bs = tr.batches(n + 1, tr.wl.batch)
    for b in bs[:n]:
        tr.step(b)
    before = layer_states(tr.raw)
    params_before = _param_checksum(tr.model, tr.sharded)
    path = os.path.join(ctx.tmpdir, ph.name.replace(" ", "_").replace("/", "-"))
    if ph.wrapper == "ddp":
        if ctx.rank == 0:
            torch.save(tr.raw.state_dict(), path + ".pt")
        dist.barrier()
    else:
        dcp.save(get_model_state_dict(tr.model), checkpoint_id=path)
    del tr
    raw = build(ctx, ph)
    fresh_states = layer_states(raw)
    if ph.wrapper == "ddp":
        raw.load_state_dict(torch.load(path + ".pt", map_location=ctx.device, weights_only=True))
        fresh = Trainer(ctx, ph, raw=raw)
    else:
        fresh = Trainer(ctx, ph, raw=raw)
        sd = get_model_state_dict(fresh.model)
        dcp.load(sd, checkpoint_id=path)
        set_model_state_dict(fresh.model, sd)
    after = layer_states(fresh.raw)
    params_after = _param_checksum(fresh.model, fresh.sharded)
    fresh.step(bs[n])
    resumed = layer_states(fresh.raw)
    mine = {"before": before, "fresh": fresh_states, "after": after, "resumed": resumed,
            "params_before": params_before, "params_after": params_after}
    ranks = gather(mine)  # also: every rank has loaded
    if ctx.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
        if os.path.exists(path + ".pt"):
            os.remove(path + ".pt")
    return {"ranks": ranks, "steps_before_save": n}


def poison(ctx, ph: Phase) -> dict:
    """Rank 1's g_y is all zero (its loss times 0) or holds a NaN (a hook on the middle HOT
    layer's output) in the step in which LQS calibrates, while rank 0 trains normally; then one
    normal step. Both steps must end on both ranks within --hang-timeout (a watchdog ends a rank
    that hangs), with the same LQS decisions on every rank after each.

    Two warm-up steps first, with per-token and then per-tensor g_y scaling forced (no
    calibration), compile the kernels of both modes, so that the limit applies to the
    collectives and not to the compiler."""
    cfg = ph.hot_config()
    tr = Trainer(ctx, ph, config=cfg.replace(hq={"gy_scale": "token"}))
    bs = tr.batches(4, tr.wl.batch)
    warm, bs = bs[:2], bs[2:]
    tr.step(warm[0])
    hot.set_config(tr.raw, cfg.replace(hq={"gy_scale": "tensor"}))
    tr.step(warm[1])
    hot.set_config(tr.raw, cfg)
    undecided_at_start = all(s[0] == -1 for s in layer_states(tr.raw))
    layers = hot.hot_layers(tr.raw)
    target, layer = layers[len(layers) // 2]
    handle = None
    if ph.case == "nan" and ctx.rank == 1:
        def put_nan(g):
            g = g.clone()
            g.view(-1)[0] = float("nan")
            return g

        def on_output(mod, inputs, output):
            output.register_hook(put_nan)

        handle = layer.register_forward_hook(on_output)
    out = {"layer": target, "undecided_at_start": undecided_at_start}
    for k, b in enumerate(bs):
        scale = 0.0 if (ph.case == "zero" and ctx.rank == 1 and k == 0) else 1.0
        ctx.arm(ctx.opts.hang_timeout, f"step {k} of {ph.name} (a hang: a rank waits for a "
                                       f"collective another rank never starts)")
        t0 = time.perf_counter()
        loss, _, stepped = tr.step(b, loss_scale=scale, skip_nonfinite=True)
        sync(ctx.device)
        wall = time.perf_counter() - t0
        if handle is not None:
            handle.remove()
            handle = None
        states = gather({"wall_s": wall, "loss": float(loss), "stepped": stepped,
                         "layer_states": layer_states(tr.raw)})
        out[f"step{k}"] = states
    ctx.arm(None, "")
    return out


PHASES = {"curve": curve, "speed": speed, "checkpoint": checkpoint, "poison": poison}
