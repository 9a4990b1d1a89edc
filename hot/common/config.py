"""HOTConfig: one frozen dataclass with one sub-config per backward path.

Names from the paper (Kim et al., "HOT: Hadamard-based Optimized Training", CVPR 2025):

* **HQ** (Hadamard Quantization), the g_x path: g_x = g_y W is computed from 4-bit operands
  after a 16-point block Walsh-Hadamard transform along the output channels O.
* **HLA** (Hadamard Low-rank Approximation), the g_W path: g_W = g_y^T x is computed from
  the r lowest-sequency Walsh coefficients of every block of 16 token rows, in INT8.
* **ABC** (Activation Buffer Compression): the forward saves only the HLA-compressed INT8
  copy of x (``T x``) for the g_W path, never x itself.
* **LQS** (Layer-wise Quantizer Selection): each layer chooses per-token or per-tensor scaling
  of g_y on the g_x path from its own gradient statistics.

``HOTConfig()`` is the default: the paper's method with an unbiased weight gradient (HLA's rows
drawn per block, selection "stratified") and HQ's width following the GPU (bits "auto");
``HOTConfig.paper()`` is the paper's setting exactly (4-bit HQ, the fixed low-pass HLA);
``HOTConfig.exact()`` disables quantization and low rank so that gradients equal autograd's
(up to float rounding of the orthonormal transforms).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

VALID_BITS = (4, 8)
VALID_RANKS = (1, 2, 4, 8, 16)
# The backward algorithms HOTConfig.method selects (hot.nn.backward implements each); the
# methods the tools offer are recipes (hot.recipes), each of which names one of these.
BACKWARDS = ("hot", "int4", "luq", "lbp_wht")
# The backwards whose g_W reads x's HLA codes (ABC); "int4" and "luq" quantize x itself.
ABC_BACKWARDS = ("hot", "lbp_wht")
# HOTConfig.forward: how the forward GEMM y = x W^T runs (hot.nn.forward).
FORWARDS = ("exact", "int8")
BLOCK = 16  # the paper's block size for both transforms; kernels assume it
SELECTIONS = ("auto", "lowpass", "lp_l1", "stratified")  # HLAConfig.selection
ABC_MODES = ("save", "recompute", "auto", "offload")  # HLAConfig.abc
DRAWN_SELECTIONS = ("stratified",)  # drawn per layer, step and block: unbiased
# "stratified": rows kept of each sequency band (0-3, 4-7, 8-11, 12-15) per rank
STRATA = {4: (1, 1, 1, 1), 8: (4, 2, 1, 1), 16: (4, 4, 4, 4)}


class HOTConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_int(where: str, value, fix: str) -> None:
    if not _is_int(value):
        raise HOTConfigError(f"{where}={value!r} must be an int ({type(value).__name__} given); "
                             f"{fix}")


def _check_bits(where: str, bits: Optional[int]) -> None:
    if bits is not None:
        _check_int(where, bits, "use 4 or 8, or None to turn quantization off on this path.")
    if bits is not None and bits not in VALID_BITS:
        raise HOTConfigError(
            f"{where}={bits!r} is not supported: use 4 or 8 (integer GEMMs exist only for these), "
            f"or None to turn quantization off on this path."
        )


def _check_choice(where: str, value: str, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in choices:
        raise HOTConfigError(f"{where}={value!r} is not one of {choices}.")


@dataclass(frozen=True)
class HQConfig:
    """The g_x path (HQ): g_x = deq(Q(g_y H) . Q(H^T W)).

    bits: 4 (paper) or 8; None = no quantization (the transform still runs, exactly); "auto"
        (default) = 4 where the GPU has INT4 tensor cores (compute capability 8.x: Ampere and
        Ada, where the 4-bit GEMM runs at twice the 8-bit rate) and 8 elsewhere (Hopper has no
        INT4 tensor cores, so its 4-bit codes run through the same INT8 GEMM and 8 bits cost
        nothing; on a CPU neither width is faster), decided per call from the data's device
        (``hq_bits``) so both backends compute the same function on one device.
    gy_scale: "auto" lets LQS pick per layer; "token" or "tensor" forces one choice.
    w_scale: "channel" = one scale per input channel of W (constant along the contracted
        dimension O, so an integer GEMM can apply it in its epilogue), or "tensor".
    gy_rounding / w_rounding: "stochastic" (unbiased) or "nearest".
    """

    bits: "Optional[int | str]" = "auto"
    gy_scale: str = "auto"
    w_scale: str = "channel"
    gy_rounding: str = "stochastic"
    w_rounding: str = "stochastic"

    def __post_init__(self) -> None:
        if self.bits != "auto":
            _check_bits("HQConfig.bits", self.bits)
        _check_choice("HQConfig.gy_scale", self.gy_scale, ("auto", "token", "tensor"))
        _check_choice("HQConfig.w_scale", self.w_scale, ("channel", "tensor"))
        _check_choice("HQConfig.gy_rounding", self.gy_rounding, ("stochastic", "nearest"))
        _check_choice("HQConfig.w_rounding", self.w_rounding, ("stochastic", "nearest"))


@dataclass(frozen=True)
class HLAConfig:
    """The g_W path (HLA) and what the forward saves (ABC).

    rank: r of every 16 Walsh coefficients kept per block of 16 token rows; 16 = no low rank.
    selection: which r of the 16 Walsh rows each block keeps.
        "lowpass" = the r lowest sequencies (the paper's 1-D low-pass): a fixed projection, so
        g_W is biased (at rank 8 it is g_W of averaged token pairs).
        "lp_l1" = the paper's 2-D LP_L1 criterion from LBP-WHT read on a 4x4 grid (fixed too).
        "stratified" = drawn per layer, step and block of 16 tokens from the layer's seed: the
        sequency bands 0-3, 4-7, 8-11, 12-15 keep (4, 2, 1, 1) rows at rank 8 ((1, 1, 1, 1) at
        rank 4), each row drawn uniformly inside its band and weighted by 1 / p, so
        E[g_W] is the exact g_W (hot.common.walsh; docs/algorithm.md). The same GEMM shapes
        and the same saved codes as "lowpass"; ranks 4, 8 and 16.
        "auto" (default) = "stratified" on Linear layers and "lowpass" on Conv2d layers
        (``for_layer``; a layer's hot_config keeps "auto"): a convolution's token
        rows are overlapping windows of an image, so smooth along the tokens that the low-pass
        drops little and the drawn rows' variance costs more than the bias they remove
        (measured: ResNet-18 from scratch on Fashion-MNIST lost 1.27 points to FP32 with the
        low-pass and 1.91 with the stratified rows; a ViT's Linear layers the reverse,
        docs/results.md).
    blocking: "flat" = blocks of 16 consecutive rows of the flattened token axis (default);
        "sequence" = blocks stay inside each sequence (the second-to-last input dimension),
        each sequence zero-padded to a multiple of 16.
    bits: 8 (paper) or 4; None = no quantization.
    scale: "channel" = per output channel for T g_y and per input channel for T x; or "tensor".
    rounding: "stochastic" or "nearest", for both operands (T g_y and the saved T x).
    abc: when the ABC codes of T x are formed (ABC). "save" (the paper as written): in forward,
        and the forward keeps them. "recompute": the forward keeps x itself and backward forms
        the codes with the forward's seed (eagerly the same codes, so the same g_W). "auto"
        (default): "recompute" exactly where keeping x is free, else "save": eagerly where x's
        producer keeps x for its own backward anyway (a ReLU before a conv, attention's output
        before a projection; read from the autograd node's type), under torch.compile where
        ``torch._functorch.config.ban_recompute_materialized_backward = False`` lets the
        compiler rebuild x in backward from what other ops keep (a LayerNorm's input, a
        pre-activation) instead of saving it. Eagerly the work only moves from forward to
        backward (under compile the compiler also recomputes x). Where it applies, a layer
        keeps nothing of its own (docs/performance.md, "Memory"); under compile the rebuilt x
        may differ from the forward's by the rounding of the compiler's recomputation.
        "recompute" keeps more where x is not kept anyway, except for convs whose patches'
        codes outgrow x (a 3x3 stride-1 conv's take 4.5 bytes per element of x). "offload": as
        "save", but the codes wait for backward in pinned host memory (hot.nn.offload: copied
        out on a side stream in forward, back ahead of the backward that needs them), so the
        GPU keeps none of them and backward forms nothing again; on a CUDA device, not under
        CUDA graphs (on a CPU it is "save").
    amax: where the per-channel scales of T g_y and T x come from. "current" (the paper): each
        channel's absmax of this pass's coefficients, a reduction over every token before the
        first code, so a pass reads its input twice. "delayed": the channel's absmax h of the
        layer's previous pass over the same operand, times 4, kept wherever this pass's own
        absmax a lies within [h / 4, 4 h] (no code clips, at least 1/16 of the levels in
        use), else a's scale as with "current" (hot.common.quant.delayed_scale); the fast
        backend then quantizes from one read and re-reads only the channels outside that
        window (docs/algorithm.md, "One read with a delayed scale"). Needs scale="channel"
        and bits.
    share: whose seeds a Linear layer's ABC codes and drawn rows follow. "none" (default): the
        layer's own. "siblings": those of the first Linear layer of its parent module with the
        same in_features and config (hot.nn.groups), so layers that read one input (q, k, v;
        gate, up) form the same codes of it, which torch.compile then forms once (one pass
        over x instead of one per layer, and one copy kept for backward). Each layer's g_W
        stays unbiased; sibling layers' errors become correlated. Needs amax="current" (a
        delayed scale is per layer).
    """

    rank: int = 8
    selection: str = "auto"
    blocking: str = "flat"
    bits: Optional[int] = 8
    scale: str = "channel"
    rounding: str = "stochastic"
    abc: str = "auto"
    amax: str = "current"
    share: str = "none"

    def __post_init__(self) -> None:
        _check_int("HLAConfig.rank", self.rank, f"use one of {VALID_RANKS}.")
        if self.rank not in VALID_RANKS:
            raise HOTConfigError(
                f"HLAConfig.rank={self.rank!r} is not supported: use one of {VALID_RANKS} "
                f"(rows kept of every {BLOCK}-point Walsh block; 16 = no low rank)."
            )
        _check_choice("HLAConfig.selection", self.selection, SELECTIONS)
        if self.selection in (*DRAWN_SELECTIONS, "auto") and self.rank not in STRATA:
            raise HOTConfigError(
                f"HLAConfig(selection={self.selection!r}) supports rank {sorted(STRATA)}, not "
                f"{self.rank!r}: it keeps at least one row of each of the four sequency bands. "
                f"Use rank 4 or 8, or selection='lowpass'.")
        _check_choice("HLAConfig.blocking", self.blocking, ("flat", "sequence"))
        _check_bits("HLAConfig.bits", self.bits)
        _check_choice("HLAConfig.scale", self.scale, ("channel", "tensor"))
        _check_choice("HLAConfig.rounding", self.rounding, ("stochastic", "nearest"))
        _check_choice("HLAConfig.abc", self.abc, ABC_MODES)
        _check_choice("HLAConfig.amax", self.amax, ("current", "delayed"))
        if self.amax == "delayed" and self.selection in (*DRAWN_SELECTIONS, "auto"):
            raise HOTConfigError(
                f"HLAConfig(amax='delayed') needs a fixed row selection, not "
                f"selection={self.selection!r} (a drawn selection's scales are the absmax of "
                f"every row): use selection='lowpass' or amax='current'.")
        _check_choice("HLAConfig.share", self.share, ("none", "siblings"))
        if self.share != "none" and self.amax == "delayed":
            raise HOTConfigError(
                f"HLAConfig(share={self.share!r}) needs amax='current', not 'delayed': a delayed "
                f"scale is the layer's own history, so sibling layers would form different "
                f"codes of one input. Use share='none' or amax='current'.")
        if self.amax == "delayed" and (self.scale != "channel" or self.bits is None):
            raise HOTConfigError(
                f"HLAConfig(amax='delayed') needs scale='channel' and bits 4 or 8, not "
                f"scale={self.scale!r}, bits={self.bits!r}: a delayed scale is a channel's "
                f"absmax of the previous pass.")


@dataclass(frozen=True)
class LQSConfig:
    """Layer-wise quantizer selection for g_y on the g_x path.

    A layer picks per-token scaling when its expected quantization error is below
    ``ratio`` times that of per-tensor scaling, measured on the transformed g_y of the
    first ``calibration_steps`` backward passes (per-token is used while calibrating).
    """

    ratio: float = 0.5
    calibration_steps: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise HOTConfigError(f"LQSConfig.ratio={self.ratio!r} must be a number in (0, 1] "
                                 f"({type(self.ratio).__name__} given).")
        _check_int("LQSConfig.calibration_steps", self.calibration_steps, "use 1 or more.")
        if not (0.0 < self.ratio <= 1.0):
            raise HOTConfigError(f"LQSConfig.ratio={self.ratio!r} must be in (0, 1].")
        if self.calibration_steps < 1:
            raise HOTConfigError(
                f"LQSConfig.calibration_steps={self.calibration_steps!r} must be >= 1."
            )


def hq_bits(bits: "Optional[int | str]", device) -> int:
    """HQConfig.bits for data on ``device`` (0 = no quantization): "auto" is 4 on a CUDA
    device of compute capability 8.x (INT4 tensor cores), else 8."""
    if bits != "auto":
        return bits or 0
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] == 8:
        return 4
    return 8


def _sub(cls, d):
    """Sub-config ``cls`` from a dict, naming an unknown field (a sub-config passes through)."""
    if isinstance(d, cls):
        return d
    if not isinstance(d, dict):
        raise HOTConfigError(f"{cls.__name__} from {d!r}: expected a dict of its fields")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise HOTConfigError(f"{cls.__name__} has no field(s) {sorted(unknown)}; "
                             f"fields: {sorted(names)}")
    return cls(**d)


@dataclass(frozen=True)
class HOTConfig:
    """Everything that defines HOT's backward pass for one layer.

    exact_steps: the first N backward calls of each layer use exact gradients (and save x).
    method: "hot" (HQ on g_x, HLA on g_W, as configured), or a baseline without a transform:
        "int4", the paper's naive INT4 (both backward GEMMs on operands quantized directly, at
        full rank: g_y and W with hq's bits, rounding and scales; g_y and x along the tokens
        with hla's), or "luq", the same with g_y on LUQ's 4-bit logarithmic levels. Both keep x
        in the forward (hla.abc "recompute", rank 16, a fixed g_y scale); see HOTConfig.int4()
        and HOTConfig.luq(). "lbp_wht": no quantization (hq.bits = hla.bits = None); g_W as
        HLA's, g_x = P g_y W with P HLA's projection along the tokens; HOTConfig.lbp_wht().
    exact_from: None, or from a layer's backward call N on (0-based) its gradients are exact
        again: an exact cool-down for the last steps of a schedule (N = the step the cool-down
        starts at; with one backward per layer and optimizer step, total steps minus its length).
    int8_steps: after those, N more calls run the g_x path at 8 bits (the paper's pre-training
        schedule runs INT8 for the first epochs, then the target bit width).
    seed: the base of every stochastic-rounding seed, hashed with (layer, step, operand, rank);
        None uses ``torch.initial_seed()`` (the last ``torch.manual_seed``), so runs repeat under
        the same torch seed. No torch generator is ever drawn from.
    min_in_features: a layer whose input width (in_features; C * kh * kw for a convolution) is
        below this runs its backward exactly, as autograd would (in its own dtype, keeping x),
        and never quantizes: HOT's quantizer passes cost about as much as narrow layers' GEMMs
        save (on an H100, ViT-B's 768-wide layers ran their HOT backward at 0.6-0.9x of BF16,
        its 3072-wide fc2 and Llama's 4096-wide layers at 1.1-2.0x; docs/performance.md).
        0 (default, the paper's setting): every converted layer runs HOT.
    forward: "exact" (default, the paper's setting): the forward GEMM is the layer's own
        (F.linear / F.conv2d in the input's dtype). "int8": HQ for the forward too, y = x W^T
        from INT8 codes of x and W after the 16-point block Hadamard transform along the input
        channels (per-token scales for x, per-output-channel for W, round to nearest; the
        transform is orthonormal, so only the rounding changes y) and an integer GEMM
        (docs/algorithm.md §5b). The backward is unchanged: its gradients are those of the
        exact product (straight-through). The exact phases (exact_steps, exact_from), narrow
        layers (min_in_features) and inference (no gradient needed: the plain module runs)
        run an exact forward. HOTConfig.quantized() is this with the default backward.
    """

    hq: HQConfig = field(default_factory=HQConfig)
    hla: HLAConfig = field(default_factory=HLAConfig)
    lqs: LQSConfig = field(default_factory=LQSConfig)
    exact_steps: int = 0
    int8_steps: int = 0
    seed: Optional[int] = None
    min_in_features: int = 0
    exact_from: Optional[int] = None
    method: str = "hot"
    forward: str = "exact"

    def __post_init__(self) -> None:
        for name, cls in (("hq", HQConfig), ("hla", HLAConfig), ("lqs", LQSConfig)):
            v = getattr(self, name)
            if not isinstance(v, cls):
                raise HOTConfigError(
                    f"HOTConfig.{name}={v!r} must be a hot.{cls.__name__} "
                    f"({type(v).__name__} given); e.g. HOTConfig({name}=hot.{cls.__name__}(...)), "
                    f"or HOTConfig().replace({name}={{...}}) to change some fields.")
        for name in ("exact_steps", "int8_steps", "min_in_features"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise HOTConfigError(f"HOTConfig.{name}={v!r} must be a non-negative int.")
        _check_choice("HOTConfig.method", self.method, BACKWARDS)
        _check_choice("HOTConfig.forward", self.forward, FORWARDS)
        if self.method in ("int4", "luq"):
            m = self.method
            for name, value, ok, fix in (
                    ("hla.rank", self.hla.rank, self.hla.rank == 16, "16 (it runs at full rank)"),
                    ("hla.abc", self.hla.abc, self.hla.abc == "recompute",
                     "'recompute' (it quantizes the kept x in backward)"),
                    ("hq.gy_scale", self.hq.gy_scale, self.hq.gy_scale != "auto",
                     "'tensor' or 'token' (no LQS)"),
                    ("hq.bits", self.hq.bits, m != "luq" or self.hq.bits == 4,
                     "4 (LUQ's levels are defined at 4 bits)"),
                    ("hla.bits", self.hla.bits, m != "luq" or self.hla.bits == 4,
                     "4 (LUQ's levels are defined at 4 bits)"),
                    ("int8_steps", self.int8_steps, m != "luq" or self.int8_steps == 0,
                     "0 (LUQ has no 8-bit levels)")):
                if not ok:
                    raise HOTConfigError(f"HOTConfig(method={m!r}) needs {name} = {fix}, not "
                                         f"{value!r}; start from HOTConfig.{m}().")
        if self.method == "lbp_wht":
            for name, value, ok, fix in (
                    ("hla.selection", self.hla.selection,
                     self.hla.selection not in DRAWN_SELECTIONS, "'lp_l1' or 'lowpass'"),
                    ("hq.bits", self.hq.bits, self.hq.bits is None, "None (no quantization)"),
                    ("hla.bits", self.hla.bits, self.hla.bits is None, "None (no quantization)"),
                    ("hla.blocking", self.hla.blocking, self.hla.blocking == "flat", "'flat'")):
                if not ok:
                    raise HOTConfigError(f"HOTConfig(method='lbp_wht') needs {name} = {fix}, "
                                         f"not {value!r}; start from HOTConfig.lbp_wht().")
        if self.hla.amax == "delayed" and self.method != "hot":
            raise HOTConfigError(f"HLAConfig(amax='delayed') is HOT's one-read scale; "
                                 f"HOTConfig(method={self.method!r}) quantizes without it: "
                                 f"use method='hot' or HLAConfig(amax='current').")
        if self.exact_from is not None and (not _is_int(self.exact_from) or self.exact_from < 0):
            raise HOTConfigError(f"HOTConfig.exact_from={self.exact_from!r} must be None or a "
                                 f"non-negative int (the backward call the exact cool-down "
                                 f"starts at).")
        if self.seed is not None and not _is_int(self.seed):
            raise HOTConfigError(f"HOTConfig.seed={self.seed!r} must be an int or None "
                                 f"({type(self.seed).__name__} given).")

    def exact_at(self, step: int) -> bool:
        """Whether a layer's backward call ``step`` (0-based) is exact: inside the warm-up
        (exact_steps) or the cool-down (exact_from)."""
        return step < self.exact_steps or (self.exact_from is not None and step >= self.exact_from)

    @classmethod
    def paper(cls) -> "HOTConfig":
        """The paper's setting: HQ 4-bit, HLA rank 8 of 16 (the fixed low-pass rows) in INT8,
        ABC, LQS."""
        return cls(hq=HQConfig(bits=4), hla=HLAConfig(selection="lowpass"))

    @classmethod
    def quantized(cls) -> "HOTConfig":
        """Every GEMM of a layer quantized: the default backward (HOTConfig()) with the INT8
        Hadamard-quantized forward (forward="int8")."""
        return cls(forward="int8")

    @classmethod
    def recommended(cls, exact_steps: int) -> "HOTConfig":
        """The paper's setting after ``exact_steps`` exact backward steps: the setting the
        quality study (docs/results.md) found closest to FP32 while keeping most of HLA's
        saving. Exact steps help at the start of training, not at its end, and the low-rank
        g_W is what costs accuracy; about 40% of the run exact (2 of 5 epochs) lost 0.46 points
        on TinyViT against the paper setting's 1.65, keeping 60% of HLA's g_W saving. It does
        not reach FP32 within 0.3 points on every task (the study's table says how close it
        comes). ``exact_steps`` counts each layer's backward calls (optimizer steps times
        gradient-accumulation micro-batches)."""
        if not _is_int(exact_steps) or exact_steps < 0:
            raise HOTConfigError(
                f"HOTConfig.recommended(exact_steps={exact_steps!r}): give a whole number of "
                f"exact warm-up steps >= 0, e.g. 0.4 of the run's steps.")
        return dataclasses.replace(cls.paper(), exact_steps=int(exact_steps))

    @classmethod
    def hlq(cls) -> "HOTConfig":
        """HLQ (Kim and Park), HOT's predecessor: HQ and HLA as in the paper's setting, without
        ABC (the forward keeps x; its HLA codes are formed in backward, with the same seed, so
        eagerly the same g_W) and without LQS (per-token g_y scales on every layer, the
        official code's quantizer when LQS is off)."""
        return cls(hq=HQConfig(bits=4, gy_scale="token"),
                   hla=HLAConfig(selection="lowpass", abc="recompute"))

    @classmethod
    def int4(cls) -> "HOTConfig":
        """The paper's naive INT4 baseline: g_x = Q4(g_y) Q4(W) and g_W = Q4(g_y)^T Q4(x) with
        4-bit stochastic rounding and one absmax scale per tensor, no transform, full rank."""
        return cls(method="int4",
                   hq=HQConfig(bits=4, gy_scale="tensor", w_scale="tensor"),
                   hla=HLAConfig(rank=16, selection="lowpass", bits=4, scale="tensor",
                                 abc="recompute"))

    @classmethod
    def luq(cls) -> "HOTConfig":
        """The LUQ baseline (Chmiel et al., ICLR 2023) with the forward unchanged: g_y on 4-bit
        radix-2 logarithmic levels with stochastic underflow and unbiased rounding between
        powers of two (one absmax per tensor), W and x as in HOTConfig.int4()."""
        return dataclasses.replace(cls.int4(), method="luq")

    @classmethod
    def lbp_wht(cls, rank: int = 8) -> "HOTConfig":
        """The LBP-WHT baseline (Yang et al., NeurIPS 2023), unquantized: g_y and x projected onto
        ``rank`` of the 16 Walsh rows of every block of 16 tokens (the 2-D LP_L1 order read on
        each block as a 4x4 patch) on both backward paths: g_x = P g_y W, g_W = (T g_y)^T (T x),
        the forward keeping T x."""
        return cls(method="lbp_wht", hq=HQConfig(bits=None),
                   hla=HLAConfig(rank=rank, selection="lp_l1", bits=None))

    @classmethod
    def exact(cls) -> "HOTConfig":
        """No quantization and no low rank: the transforms run but are orthonormal, so the
        gradients equal autograd's up to float rounding."""
        return cls(hq=HQConfig(bits=None), hla=HLAConfig(rank=16, selection="lowpass", bits=None))

    def for_layer(self, conv: bool) -> "HOTConfig":
        """This config as a layer runs it: HLAConfig.selection "auto" resolved ("lowpass" for a
        convolution, ``conv``, else "stratified"); unchanged otherwise."""
        if self.hla.selection != "auto":
            return self
        return self.replace(hla={"selection": "lowpass" if conv else "stratified"})

    def replace(self, **changes) -> "HOTConfig":
        """A copy with top-level fields replaced; sub-configs take dicts of their own fields,
        e.g. ``cfg.replace(hla={"rank": 4})``."""
        out = {}
        fields = {f.name for f in dataclasses.fields(self)}
        for k, v in changes.items():
            if k not in fields:
                raise HOTConfigError(f"HOTConfig has no field {k!r}; fields: {sorted(fields)}")
            cur = getattr(self, k)
            if isinstance(v, dict) and dataclasses.is_dataclass(cur):
                v = _sub(type(cur), {**dataclasses.asdict(cur), **v})
            out[k] = v
        return dataclasses.replace(self, **out)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "HOTConfig":
        """The inverse of to_dict; missing fields take their defaults."""
        subs = {"hq": HQConfig, "hla": HLAConfig, "lqs": LQSConfig}
        top = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - top
        if unknown:
            raise HOTConfigError(f"HOTConfig has no field(s) {sorted(unknown)}; fields: {sorted(top)}")
        return cls(**{k: _sub(subs[k], v) if k in subs else v for k, v in d.items()})
