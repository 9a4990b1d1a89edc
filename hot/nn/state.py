"""Per-layer state: the step counter, LQS calibration and decision, and random seeds.

The step counter and the LQS decision are persistent buffers (``hot_step``, ``hot_lqs``), so they
survive ``state_dict`` save/load and resuming a run. ``hot_lqs``: -1 undecided, 0 per-tensor,
1 per-token.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..common.config import HOTConfig
from ..common.quant import derive_seed, derive_seed_from, expected_sr_error, seed_prefix

LQS_UNDECIDED, LQS_TENSOR, LQS_TOKEN = -1, 0, 1


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
    gy_scale_mode: str  # 'row' (per token) or 'tensor'
    seed_gy: int
    seed_w: int
    seed_hla: int


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


@functools.lru_cache(maxsize=4096)
def _prefix(seed: int, layer_id: int) -> int:
    return seed_prefix(seed, layer_id)


@functools.lru_cache(maxsize=4096)
def _step_prefix(prefix: int, step: int) -> int:
    # Shared by the forward's draw (salt 1) and the backward's (salt 2) of one step.
    return seed_prefix(step, h=prefix)


def draw_seed(cfg: HOTConfig, layer_id: int, step: int, salt: int) -> int:
    """A fresh 31-bit seed: from torch's default generator, or derived from cfg.seed.

    Each data-parallel rank gets its own stream; otherwise all ranks would round alike and
    their errors would not average out in the gradient all-reduce.
    """
    if cfg.seed is None:
        base = int(torch.randint(0, 2**31 - 1, (1,)).item())
    else:
        base = derive_seed_from(_step_prefix(_prefix(cfg.seed, layer_id), step), salt)
    r = _rank()
    return derive_seed(base, r) if r else base


def make_plan(layer, cfg: HOTConfig, backend: str, seq: int) -> LayerPlan:
    step = layer.hot_step_value()
    exact = step < cfg.exact_steps
    seed_x = 0 if exact else draw_seed(cfg, layer.hot_id, step, 1)
    return LayerPlan(cfg, backend, exact, seq, seed_x)


# g_y scale mode of the g_x path: forced by HQConfig.gy_scale, or LQS's decision.
_FORCED_MODE = {"token": "row", "tensor": "tensor"}
_DECIDED_MODE = {LQS_TOKEN: "row", LQS_TENSOR: "tensor"}


def _lqs_mode(layer, cfg: HOTConfig, gy2d: torch.Tensor, bits: int) -> str:
    forced = _FORCED_MODE.get(cfg.hq.gy_scale)
    if forced:
        return forced
    decided = _DECIDED_MODE.get(layer.hot_lqs_value())
    if decided:
        return decided
    # Calibrating: measure on the transformed g_y that is actually quantized.
    from ..reference.ops import hq_transform

    with torch.no_grad():
        t = hq_transform(gy2d)
        err = torch.stack([expected_sr_error(t, bits, "row"),
                           expected_sr_error(t, bits, "tensor")]).to(torch.float64)
    # A pass with NaN/Inf (an AMP overflow step) or an all-zero g_y says nothing about the
    # layer's outlier pattern: it must not lock in a decision. Calibrate on the next pass.
    if not bool(torch.isfinite(err).all()) or float(err[1]) == 0.0:
        return "row"
    layer.hot_lqs_err += err.to(layer.hot_lqs_err.device)
    layer.hot_lqs_seen += 1
    if int(layer.hot_lqs_seen) >= cfg.lqs.calibration_steps:
        decide_lqs(layer, cfg.lqs.ratio)
    return "row"  # per-token while calibrating: never worse on outliers


def decide_lqs(layer, ratio: float) -> int:
    """Per-token iff sqrt(E_token) < ratio * sqrt(E_tensor); sums are all-reduced across ranks."""
    err = layer.hot_lqs_err.clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(err)
    e_tok, e_ten = float(err[0]), float(err[1])
    choice = LQS_TOKEN if e_tok**0.5 < ratio * e_ten**0.5 else LQS_TENSOR
    layer.set_lqs(choice)
    return choice


def begin_backward(layer, plan: LayerPlan, gy2d: torch.Tensor) -> BackwardPlan:
    cfg = plan.config
    step = layer.hot_advance_step()
    if plan.exact:
        return BackwardPlan(True, 0, "tensor", 0, 0, 0)
    bits = cfg.hq.bits or 0
    if bits and step < cfg.exact_steps + cfg.int8_steps:
        bits = 8
    mode = _lqs_mode(layer, cfg, gy2d, bits) if bits else "tensor"
    h = seed_prefix(draw_seed(cfg, layer.hot_id, step, 2))  # shared by the three derivations
    # operand k's seed is derive_seed(seed, k): 1 = g_y (HQ), 2 = W, 3 = g_y (HLA)
    return BackwardPlan(False, bits, mode, derive_seed_from(h, 1), derive_seed_from(h, 2),
                        derive_seed_from(h, 3))
