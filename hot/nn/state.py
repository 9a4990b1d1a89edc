"""Per-layer state: the step counter, LQS calibration and decision, and rounding seeds.

The step counter and the LQS decision are persistent buffers (``hot_step``, ``hot_lqs``), so they
survive ``state_dict`` save/load and resuming a run. ``hot_lqs``: -1 undecided, 0 per-tensor,
1 per-token. Python mirrors of both are what the hot path reads (reading a CUDA buffer every
step would synchronize the GPU).

Seeds: a stochastic-rounding seed is a hash of (base, layer id, step, salt, data-parallel rank),
where base is ``HOTConfig.seed``, or, when that is None, ``torch.initial_seed()`` (the seed of
the last ``torch.manual_seed``). Nothing draws from a torch generator, so converting a model
never changes its dropout masks or data order; ``torch.manual_seed`` still makes runs
repeatable and different seeds give different rounding. Each rank mixes in its rank, so ranks
round independently and their errors average out in the gradient all-reduce.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..common import lqs
from ..common.config import HOTConfig
from ..common.ops import ScaleMode
from ..common.quant import M32, derive_seed, derive_seed_from, seed_prefix

LQS_UNDECIDED, LQS_TENSOR, LQS_TOKEN = -1, lqs.TENSOR, lqs.TOKEN


@dataclass(frozen=True)
class LayerPlan:
    """Decisions taken in forward that backward must honour."""

    config: HOTConfig
    backend: str
    exact: bool  # this call is within exact_steps: x is saved, gradients are exact
    seq: int  # rows per sequence for blocking='sequence', else 0
    seed_x: int  # stochastic-rounding seed of the ABC copy


@dataclass(frozen=True)
class BackwardPlan:
    exact: bool
    gx_bits: int  # 0 = no quantization
    gy_scale_mode: ScaleMode
    seed_gy: int
    seed_w: int
    seed_hla: int


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


@functools.lru_cache(maxsize=4096)
def _layer_prefix(base: int, layer_id: int) -> int:
    return seed_prefix(base & M32, (base >> 32) & M32, layer_id)


@functools.lru_cache(maxsize=4096)
def _step_prefix(prefix: int, step: int) -> int:
    # Shared by the forward's seed (salt 1) and the backward's (salt 2) of one step.
    return seed_prefix(step, h=prefix)


def layer_seed(cfg: HOTConfig, layer_id: int, step: int, salt: int) -> int:
    """The 31-bit seed of (layer, step, salt) on this rank (module docstring)."""
    base = cfg.seed if cfg.seed is not None else torch.initial_seed()
    s = derive_seed_from(_step_prefix(_layer_prefix(base, layer_id), step), salt)
    r = _rank()
    return derive_seed(s, r) if r else s


def make_plan(layer, cfg: HOTConfig, backend: str, seq: int, empty: bool = False) -> LayerPlan:
    """The plan of one forward call. An input without tokens (an empty batch, an expert that got
    none) runs exactly: its gradients are empty or zero, with nothing to quantize."""
    step = layer.hot_step_value()
    exact = step < cfg.exact_steps or empty
    seed_x = 0 if exact or not cfg.hla.bits or cfg.hla.rounding != "stochastic" \
        else layer_seed(cfg, layer.hot_id, step, 1)
    return LayerPlan(cfg, backend, exact, seq, seed_x)


# g_y scale mode of the g_x path: forced by HQConfig.gy_scale, or LQS's decision.
_FORCED_MODE = {"token": ScaleMode.ROW, "tensor": ScaleMode.TENSOR}
_DECIDED_MODE = {LQS_TOKEN: ScaleMode.ROW, LQS_TENSOR: ScaleMode.TENSOR}


def _lqs_mode(layer, cfg: HOTConfig, gy2d: torch.Tensor, bits: int) -> ScaleMode:
    forced = _FORCED_MODE.get(cfg.hq.gy_scale)
    if forced:
        return forced
    decided = _DECIDED_MODE.get(layer.hot_lqs_value())
    if decided:
        return decided
    # Calibrating, on the transformed g_y that is actually quantized. Every pass counts, also
    # one that contributes nothing (non-finite or all-zero g_y, no tokens), so that every
    # data-parallel rank reaches the decision's all-reduce on the same pass.
    stats = layer.hot_lqs_stats
    stats[0] += lqs.statistics(gy2d, bits).cpu()
    stats[1] += 1
    if stats[1] >= cfg.lqs.calibration_steps:
        decide_lqs(layer, cfg.lqs.ratio, gy2d.device)
    return ScaleMode.ROW  # per-token while calibrating: never worse on outliers


def decide_lqs(layer, ratio: float, device: torch.device) -> int:
    """Decide from the statistics summed over the calibration passes and all ranks; while no
    rank saw a usable g_y, stay undecided and calibrate again (every rank alike)."""
    total, _ = layer.hot_lqs_stats
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # On the layer's device: NCCL reduces CUDA tensors only.
        t = total.to(device=device)
        dist.all_reduce(t)
        total = t.cpu()
    if float(total[2]) == 0:
        layer.set_lqs(LQS_UNDECIDED)
        return LQS_UNDECIDED
    choice = lqs.choose(total, ratio)
    layer.set_lqs(choice)
    return choice


def begin_backward(layer, plan: LayerPlan, gy2d: torch.Tensor) -> BackwardPlan:
    cfg = plan.config
    step = layer.hot_advance_step()
    if plan.exact:
        return BackwardPlan(True, 0, ScaleMode.TENSOR, 0, 0, 0)
    bits = cfg.hq.bits or 0
    if bits and step < cfg.exact_steps + cfg.int8_steps:
        bits = 8
    mode = _lqs_mode(layer, cfg, gy2d, bits) if bits else ScaleMode.TENSOR
    h = seed_prefix(layer_seed(cfg, layer.hot_id, step, 2))  # shared by the three derivations
    # operand k's seed is derive_seed(seed, k): 1 = g_y (HQ), 2 = W, 3 = g_y (HLA)
    return BackwardPlan(False, bits, mode, derive_seed_from(h, 1), derive_seed_from(h, 2),
                        derive_seed_from(h, 3))
