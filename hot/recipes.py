"""Training recipes: one object per method, the one vocabulary of methods every tool reads.

A :class:`Recipe` names a method and holds what defines it: the :class:`~hot.HOTConfig` it
trains with (None for exact training), the autocast dtype, and, read from that config, what it
quantizes in the forward GEMM (F), the g_x GEMM (D) and the g_W GEMM (W), what the forward keeps
for backward, and which cost models of :mod:`hot.analysis` describe it. ``hot train --method``,
``hot compare --methods``, ``hot memory --methods``, ``hot gbops --methods``, the quality study
and the end-to-end benchmark look methods up here (TransformerEngine's ``Recipe`` classes and
torchao's named float8 recipes are the models). Adding a method is one :func:`register` call.

The module sits at the package's top, beside :func:`hot.convert`, rather than in hot.common:
a recipe prepares a model (it converts layers, so it needs hot.nn), and nothing in the library
below needs the list of methods. HOTConfig.method, the backward algorithm a config runs, is
validated against hot.common.config.BACKWARDS, which recipes read and do not restate.
"""

from __future__ import annotations

import contextlib
import difflib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .common.config import BACKWARDS, HOTConfig
from .nn.convert import convert, hot_layers
from .nn.forward import FORWARD_BITS


class RecipeError(ValueError):
    """An unknown recipe name, or a recipe that cannot be registered; says what to give."""


@dataclass(frozen=True)
class Operands:
    """How one GEMM's operands are formed (read from a HOTConfig by :func:`gemms`).

    bits: integer width of both operands, or "auto" (HQConfig.bits "auto": 4 or 8, by the
        GPU); None = not quantized (the GEMM runs in ``dtype``).
    transform: None, "hadamard16" (16-point block Walsh-Hadamard along the contracted dimension,
        HQ) or "walsh16" (16-point Walsh blocks along the tokens, HLA and LBP-WHT).
    rank: Walsh rows kept of every 16 along the tokens (None = all: no low rank).
    selection: which rows ``rank`` keeps (an HLAConfig.selection); None without low rank.
    rounding, scaling: per operand, e.g. "g_y stochastic, W stochastic", "g_y auto (LQS), W
        channel"; None where nothing is quantized.
    levels: "uniform", or "log2" (LUQ's logarithmic g_y levels).
    dtype: the width of the unquantized values ("fp32" or the autocast dtype's name).
    """

    bits: Optional[int] = None
    transform: Optional[str] = None
    rank: Optional[int] = None
    selection: Optional[str] = None
    rounding: Optional[str] = None
    scaling: Optional[str] = None
    levels: str = "uniform"
    dtype: str = "fp32"

    def describe(self) -> str:
        """One phrase, e.g. 'int4, hadamard16, g_y auto (LQS), W channel'."""
        if self.bits is None and self.transform is None:
            return f"exact ({self.dtype})"
        width = "int4/8 (auto: by GPU)" if self.bits == "auto" else f"int{self.bits}"
        parts = [width if self.bits else f"unquantized ({self.dtype})"]
        if self.transform:
            parts.append(self.transform if self.rank is None
                         else f"{self.transform} rank {self.rank}/16 {self.selection}")
        if self.levels != "uniform":
            parts.append(f"{self.levels} levels for g_y")
        parts += [p for p in (self.scaling, self.rounding) if p]
        return ", ".join(parts)


@dataclass(frozen=True)
class Gemms:
    """What a method does to the forward GEMM (F), g_x = g_y W (D) and g_W = g_y^T x (W), and
    what the forward keeps for backward (``saves``)."""

    F: Operands
    D: Operands
    W: Operands
    saves: str


@dataclass(frozen=True)
class Cost:
    """The cost models of a method, by name (None: not modelled).

    gbops: the counting model of hot.analysis.gbops.backward_counts ("fp", "hot", "lbp_wht" or
        "luq"), evaluated at the recipe's HLA rank.
    memory: the analytic saved-bytes model of hot.analysis.memory.analytic_layer_bytes ("fp32",
        "bf16", "hot" or "hot-bf16"), evaluated at the recipe's HLA rank and bits.
    """

    gbops: Optional[str] = None
    memory: Optional[str] = None


@dataclass(frozen=True)
class Recipe:
    """One training method.

    name: what the tools call it (lower case, no comma: lists of names are comma-separated).
    summary: one line for help texts and tables.
    config: the HOTConfig its layers train with; None = exact training, no layer converted.
    autocast: the dtype of torch.autocast around forward and loss; None = none.
    tunable: whether the hot command's quantizer flags (--hla-rank, --hq-bits, ...) build its
        config; a recipe that is not takes only the schedule flags (--exact-steps, ...).
    cost: its cost models (:class:`Cost`).
    """

    name: str
    summary: str
    config: Optional[HOTConfig] = None
    autocast: Optional[torch.dtype] = None
    tunable: bool = False
    cost: Cost = Cost()

    @property
    def exact(self) -> bool:
        """Whether it trains without HOT layers (config None)."""
        return self.config is None

    @property
    def gemms(self) -> Gemms:
        """F, D, W and what the forward saves, read from ``config``."""
        return gemms(self.config, self.autocast)

    @property
    def rank(self) -> Optional[int]:
        """HLA's rank of its g_W path (16 = no low rank); None for exact training."""
        return None if self.config is None else self.config.hla.rank

    def context(self, device: torch.device):
        """The autocast context of its forward (a null context without autocast)."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.autocast)

    def prepare(self, model: torch.nn.Module, config: Optional[HOTConfig] = None,
                filter: Optional[Callable] = None, backend: Optional[str] = None):
        """Convert ``model`` for this recipe with ``config`` (default: the recipe's own) and
        return it; an exact recipe returns it unchanged. ValueError when a HOT recipe converts
        no layer (nothing would use HOT)."""
        if self.config is None:
            return model
        # The paper's setting: every layer, the output head too (the library's default leaves
        # it exact); a filter that names LoRA adapters converts them.
        convert(model, config or self.config, filter=filter, convert_head=True,
                convert_adapters=True, backend=backend)
        if not hot_layers(model):
            raise ValueError(f"recipe {self.name!r}: no nn.Linear / nn.Conv2d was converted "
                             f"(check the model and the layer filter, e.g. the LoRA settings); "
                             f"nothing would use HOT.")
        return model


def _dtype_name(dtype: Optional[torch.dtype]) -> str:
    names = {None: "fp32", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    return names.get(dtype, str(dtype).replace("torch.", ""))


def gemms(config: Optional[HOTConfig], autocast: Optional[torch.dtype] = None) -> Gemms:
    """What ``config`` quantizes in F, D and W (see :class:`Gemms`); None = exact training."""
    dt = _dtype_name(autocast)
    exact = Operands(dtype=dt)
    if config is None:
        return Gemms(exact, exact, exact, f"x ({dt})")
    hq, hla, m = config.hq, config.hla, config.method
    low = dict(rank=hla.rank, selection=hla.selection) if hla.rank < 16 else {}
    w_scale = f"per {hla.scale}" + (", delayed amax" if hla.amax == "delayed" else "")
    if m == "hot":
        d = Operands(hq.bits, "hadamard16", rounding=f"g_y {hq.gy_rounding}, W {hq.w_rounding}",
                     scaling=f"g_y {'auto (LQS)' if hq.gy_scale == 'auto' else hq.gy_scale}, "
                             f"W {hq.w_scale}", dtype=dt)
    elif m in ("int4", "luq"):
        d = Operands(hq.bits, rounding=f"g_y {hq.gy_rounding}, W {hq.w_rounding}",
                     scaling=f"g_y {hq.gy_scale}, W {hq.w_scale}",
                     levels="log2" if m == "luq" else "uniform", dtype=dt)
    else:  # lbp_wht: g_y projected along the tokens on the g_x path too, unquantized
        d = Operands(None, "walsh16", dtype=dt, **low)
    transform = None if m in ("int4", "luq") else "walsh16"
    w = Operands(hla.bits, transform, rounding=hla.rounding if hla.bits else None,
                 scaling=w_scale if hla.bits else None,
                 levels="log2" if m == "luq" else "uniform", dtype=dt,
                 **(low if transform else {}))
    codes = f"T x as {'int%d codes' % hla.bits if hla.bits else dt} ({hla.rank} of 16 Walsh rows)"
    saves = {"save": codes, "recompute": f"x ({dt}); its codes are formed in backward",
             "offload": f"{codes}, in host memory until backward",
             "auto": f"{codes}, or x where x's producer keeps it anyway (abc='auto')"}[hla.abc]
    if m in ("int4", "luq"):
        saves = f"x ({dt}); quantized in backward"
    f = exact
    if config.forward != "exact":  # hot.nn.forward
        f = Operands(FORWARD_BITS[config.forward], "hadamard16", rounding="nearest",
                     scaling="x token, W channel", dtype=dt)
    return Gemms(f, d, w, saves)


RECIPES: dict[str, Recipe] = {}


def register(recipe: Recipe) -> Recipe:
    """Add ``recipe`` to RECIPES under its name; returns it. RecipeError for a name already
    registered, a name the tools could not parse, or a config whose backward is unknown."""
    n = recipe.name
    if not isinstance(n, str) or not n or n != n.strip().lower() or "," in n or " " in n:
        raise RecipeError(f"Recipe.name={n!r}: give a non-empty lower-case name without commas "
                          f"or spaces (the tools take comma-separated lists of names).")
    if n in RECIPES:
        raise RecipeError(f"recipe {n!r} is already registered ({RECIPES[n].summary}); "
                          f"choose another name.")
    if recipe.config is not None and recipe.config.method not in BACKWARDS:
        raise RecipeError(f"recipe {n!r}: config.method={recipe.config.method!r} is not one of "
                          f"{BACKWARDS}.")
    RECIPES[n] = recipe
    return recipe


def names() -> list[str]:
    """The registered recipes' names, in registration order."""
    return list(RECIPES)


def get(name: str) -> Recipe:
    """The recipe called ``name``; RecipeError naming the value, the choices and the closest."""
    if name in RECIPES:
        return RECIPES[name]
    close = difflib.get_close_matches(str(name), list(RECIPES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise RecipeError(f"method {name!r} is not a registered recipe{hint}; give one of "
                      f"{', '.join(RECIPES)}.")


register(Recipe("fp32", "exact FP32 training", cost=Cost(gbops="fp", memory="fp32")))
register(Recipe("bf16", "exact training under bf16 autocast", autocast=torch.bfloat16,
                cost=Cost(memory="bf16")))
register(Recipe("hot", "HOT (HOTConfig(), shaped by the quantizer flags) on every Linear/Conv2d "
                "(LoRA: frozen base layers only)", HOTConfig(), tunable=True,
                cost=Cost(gbops="hot", memory="hot")))
register(Recipe("hot-bf16", "HOT under bf16 autocast", HOTConfig(), autocast=torch.bfloat16,
                tunable=True, cost=Cost(gbops="hot", memory="hot-bf16")))
register(Recipe("paper", "the paper's setting as published (HOTConfig.paper()): HQ 4-bit, HLA "
                "rank 8 INT8, ABC, LQS", HOTConfig.paper(), cost=Cost(gbops="hot", memory="hot")))
register(Recipe("hlq", "HLQ, HOT's predecessor (HOTConfig.hlq()): HQ and HLA without ABC and "
                "LQS", HOTConfig.hlq(), cost=Cost(gbops="hot")))
register(Recipe("int4", "the paper's naive INT4 baseline (HOTConfig.int4()): 4-bit operands in "
                "both backward GEMMs, no transform, full rank", HOTConfig.int4()))
register(Recipe("luq", "the LUQ baseline (HOTConfig.luq()): as int4 with g_y on 4-bit "
                "logarithmic levels", HOTConfig.luq(), cost=Cost(gbops="luq")))
register(Recipe("lbp-wht", "the LBP-WHT baseline (HOTConfig.lbp_wht()): g_y and x projected on "
                "8 of 16 Walsh rows along the tokens on both paths, no quantization",
                HOTConfig.lbp_wht(), cost=Cost(gbops="lbp_wht")))

register(Recipe("hot-q", "HOT with the forward GEMM quantized too (HOTConfig.quantized(): INT8 "
                "HQ forward, HOTConfig()'s backward)", HOTConfig.quantized(), tunable=True,
                cost=Cost(gbops="hot", memory="hot")))
register(Recipe("hot-q-bf16", "hot-q under bf16 autocast", HOTConfig.quantized(),
                autocast=torch.bfloat16, tunable=True, cost=Cost(gbops="hot", memory="hot-bf16")))


def markdown() -> str:
    """The registered recipes as a markdown table (docs/api.md holds it; a test compares)."""
    rows = ["| recipe | config | autocast | forward GEMM (F) | g_x GEMM (D) | g_W GEMM (W) | "
            "forward keeps | GBOPs / memory model |", "|---|---|---|---|---|---|---|---|"]
    for r in RECIPES.values():
        g = r.gemms
        cfg = "none (exact)" if r.config is None else (
            f"method {r.config.method!r}" + (", tunable" if r.tunable else ""))
        cost = f"{r.cost.gbops or '-'} / {r.cost.memory or '-'}"
        rows.append(f"| `{r.name}` | {cfg} | {_dtype_name(r.autocast) if r.autocast else '-'} | "
                    f"{g.F.describe()} | {g.D.describe()} | {g.W.describe()} | {g.saves} | "
                    f"{cost} |")
    return "\n".join(rows)
