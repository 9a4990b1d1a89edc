"""Per-layer state: the step counter, LQS calibration and decision, and rounding seeds.

The step counter and the LQS decision are persistent buffers (``hot_step``, ``hot_lqs``), so they
survive ``state_dict`` save/load and resuming a run. ``hot_lqs``: -1 undecided, 0 per-tensor,
1 per-token. Python mirrors of both are what the hot path reads (reading a CUDA buffer every
step would synchronize the GPU).

Seeds: the stochastic-rounding seed of an operand is ``quant.step_seed(base, step)`` with the
layer's step counter and a base that hashes (B, layer id, operand, data-parallel rank), B being
``HOTConfig.seed``, or, when that is None, ``torch.initial_seed()`` (the seed of the last
``torch.manual_seed``). Nothing draws from a torch generator, so converting a model never
changes its dropout masks or data order; ``torch.manual_seed`` still makes runs repeatable and
different seeds give different rounding. Each rank mixes in its rank, so ranks round
independently and their errors average out in the gradient all-reduce. The seeds travel as
``quant.StepSeed``: the fast kernels read the step from ``hot_step`` in device memory, so a
CUDA graph replay rounds with its own step, and the counter advances by a device operation at
the end of each backward (``hot_advance_step``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from ..common import lqs
from ..common.config import DRAWN_SELECTIONS, HOTConfig, hq_bits
from ..common.ops import ScaleMode
from ..common.quant import M32, StepSeed, seed_prefix
from .groups import abc_source, check_source

LQS_UNDECIDED, LQS_TENSOR, LQS_TOKEN = -1, lqs.TENSOR, lqs.TOKEN


# Configs by a process-local integer key: a layer's backward runs with the config of its forward
# (the key travels from the forward to hot::layer_bwd as a constant), whatever set_config did
# in between. Configs are few and small, so they are kept for the process's lifetime.
_CONFIG_KEYS: dict = {}
_CONFIGS: list = []


def config_key(cfg: HOTConfig) -> int:
    """The integer naming ``cfg`` in this process (equal configs share one)."""
    key = _CONFIG_KEYS.get(cfg)
    if key is None:
        key = _CONFIG_KEYS[cfg] = len(_CONFIGS)
        _CONFIGS.append(cfg)
    return key


def config_of(key: int) -> HOTConfig:
    return _CONFIGS[key]


@dataclass(frozen=True)
class LayerPlan:
    """Decisions taken in forward that backward must honour."""

    config: HOTConfig
    backend: str
    exact: bool  # in exact_steps or past exact_from: x is saved, gradients are exact
    seq: int  # rows per sequence for blocking='sequence', else 0
    seed_x: "int | StepSeed"  # stochastic-rounding seed of the ABC codes
    x_hist: Optional[torch.Tensor] = None  # HLAConfig.amax "delayed": x's channel absmax
    # A drawn HLA selection (HLAConfig.selection "stratified"): the seed of the rows each block
    # keeps, the same for x's codes (forward) and g_y's (backward); else 0.
    seed_draw: "int | StepSeed" = 0
    # In backward, with a drawn selection: the layer's step counter as its forward saw it (a
    # device copy), which every seed of the backward follows, so g_y keeps x's rows even where
    # another backward of the layer ran in between (a layer called twice per step).
    fwd_step: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class BackwardPlan:
    exact: bool
    gx_bits: int  # 0 = no quantization
    gy_scale_mode: ScaleMode
    seed_gy: "int | StepSeed"
    seed_w: "int | StepSeed"
    seed_hla: "int | StepSeed"
    gy_hist: Optional[torch.Tensor] = None  # HLAConfig.amax "delayed": g_y's channel absmax
    seed_draw: "int | StepSeed" = 0  # LayerPlan.seed_draw, following the forward's step


def _rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


# Operand numbers in the seed bases (DRAW: a drawn HLA selection's rows).
ABC_X, GY_HQ, W_HQ, GY_HLA, DRAW = 0, 1, 2, 3, 4


@functools.lru_cache(maxsize=4096)
def _base(b: int, layer_id: int, operand: int, rank: int) -> int:
    return seed_prefix(b & M32, (b >> 32) & M32, layer_id, operand, rank)


def seed_base(cfg: HOTConfig, layer_id: int, operand: int) -> int:
    """The constant part of an operand's seeds on this rank (module docstring)."""
    b = cfg.seed if cfg.seed is not None else torch.initial_seed()
    return _base(b, layer_id, operand, _rank())


def layer_seed(layer, cfg: HOTConfig, operand: int, step: int,
               counter: Optional[torch.Tensor] = None) -> StepSeed:
    """The seed of ``operand`` at ``step`` (the current count of layer.hot_step), or, with
    ``counter`` (a copy of the counter made by the forward), at the step that copy holds."""
    if counter is not None:
        return StepSeed(seed_base(cfg, layer.hot_id, operand), counter, None)
    return StepSeed(seed_base(cfg, layer.hot_id, operand), layer.hot_step, step)


def draws_rows(cfg: HOTConfig) -> bool:
    """Whether HOT's g_W path draws its HLA rows (an unbiased, drawn selection)."""
    return cfg.method == "hot" and cfg.hla.selection in DRAWN_SELECTIONS


def hla_history(layer, cfg: HOTConfig, operand: int, device: torch.device) -> Optional[torch.Tensor]:
    """The channel absmax of the layer's previous HLA pass over ``operand`` (ABC_X: x's
    in_features, GY_HLA: g_y's out_features) under HLAConfig.amax = "delayed", else None. Zeros
    at first (quant.delayed_scale then takes the pass's own absmax). The layer makes them with
    its config and moves them with itself (_HOTMixin._hot_make_histories); they are made
    again here only for data on another device than the layer's weight. The layer's state
    dict carries them (hot_hist_x, hot_hist_gy), so a resumed run continues with them."""
    if cfg.hla.amax != "delayed":
        return None
    h = layer.__dict__.get("_hot_hist", {}).get(operand)
    if h is None or h.device != device:
        layer._hot_make_histories(device, cfg)
        h = layer._hot_hist[operand]
    return h


def is_narrow(layer, cfg: HOTConfig) -> bool:
    """Whether the layer is narrower than cfg.min_in_features: then exact on every call."""
    return cfg.min_in_features > 0 and layer.hot_in_features() < cfg.min_in_features


def make_plan(layer, cfg: HOTConfig, backend: str, seq: int, empty: bool = False) -> LayerPlan:
    """The plan of one forward call. An input without tokens (an empty batch, an expert that got
    none) runs exactly: its gradients are empty or zero, with nothing to quantize; so does a layer
    narrower than HOTConfig.min_in_features."""
    step = layer.hot_step_value()
    exact = cfg.exact_at(step) or empty or is_narrow(layer, cfg)
    # x's codes and the drawn rows follow the group source's seeds and step (HLAConfig.share)
    src = abc_source(layer)
    check_source(layer, src)
    at = step if src is layer else src.hot_step_value()
    seed_x = 0 if exact or not cfg.hla.bits or cfg.hla.rounding != "stochastic" \
        else layer_seed(src, cfg, ABC_X, at)
    hist = None if exact else hla_history(layer, cfg, ABC_X, layer.weight.device)
    draw = layer_seed(src, cfg, DRAW, at) if draws_rows(cfg) and not exact else 0
    return LayerPlan(cfg, backend, exact, seq, seed_x, hist, draw)


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
    """The plan of this backward call, at the layer's current step (which the caller advances
    with layer.hot_advance_step() once the call's kernels are enqueued)."""
    cfg = plan.config
    step = layer.hot_step_value()
    bits = hq_bits(cfg.hq.bits, gy2d.device)
    if bits and step < cfg.exact_steps + cfg.int8_steps:
        bits = 8
    if plan.exact:
        if bits and not (cfg.exact_at(step) or is_narrow(layer, cfg)):
            # Exact only because this rank's input had no tokens: another rank's is not, and its
            # LQS calibration reaches the decision's all-reduce on this pass. Take part (the
            # pass contributes nothing), so that every rank makes the same collective calls
            # whatever its data.
            _lqs_mode(layer, cfg, gy2d, bits)
        return BackwardPlan(True, 0, ScaleMode.TENSOR, 0, 0, 0)
    mode = _lqs_mode(layer, cfg, gy2d, bits) if bits else ScaleMode.TENSOR
    # With drawn rows every seed follows the forward's step (LayerPlan.fwd_step): the g_y pass
    # draws and rounds from one counter, and the W pass shares it in a one-call backward.
    at = plan.fwd_step if draws_rows(cfg) else None
    return BackwardPlan(False, bits, mode, layer_seed(layer, cfg, GY_HQ, step, at),
                        layer_seed(layer, cfg, W_HQ, step, at),
                        layer_seed(layer, cfg, GY_HLA, step, at),
                        hla_history(layer, cfg, GY_HLA, gy2d.device),
                        plan.seed_draw)
