"""HOTLinear and HOTConv2d: drop-in subclasses of nn.Linear / nn.Conv2d with HOT's backward.

They share the original Parameter objects (so optimizers, peft and FSDP see the same tensors)
and add two persistent buffers, ``hot_step`` and ``hot_lqs`` (see ``hot.nn.state``).
"""

from __future__ import annotations

import copy
import copyreg
import math
import zlib
from typing import Optional

import torch
import torch.nn as nn

from ..common.backend import resolve_backend
from ..common.config import HOTConfig
from . import autograd
from .state import ABC_X, GY_HLA, LQS_UNDECIDED, config_key

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


# What _hot_init adds to a module (unconvert removes exactly these).
HOT_BUFFERS = ("hot_step", "hot_lqs")
# The state-dict names of the delayed HLA histories (HLAConfig.amax = "delayed"): entries of the
# state dict, not buffers (DDP would broadcast buffers every step; each rank keeps its own).
HOT_HISTORIES = {ABC_X: "hot_hist_x", GY_HLA: "hot_hist_gy"}
# Every state-dict entry of HOT's own (hot.plain_state_dict and HF's save leave them out).
HOT_STATE_KEYS = HOT_BUFFERS + tuple(HOT_HISTORIES.values())
HOT_ATTRS = ("hot_config", "hot_name", "hot_backend", "hot_id", "hot_lqs_stats", "_hot_resolved",
             "_hot_step_value", "_hot_lqs_value", "_hot_exact_phase", "_hot_key", "_hot_hist",
             "_hot_config_key", "_hot_run_config", "_hot_abc_group")


class HOTLayerError(ValueError):
    """Bad input to a HOT layer; the message names the layer, the value and the fix."""


def _fresh_lqs_stats() -> list:
    """LQS's summed statistics and passes, on the CPU whatever the default device (a model built
    under ``torch.device("meta")`` must still calibrate once its weights are loaded)."""
    return [torch.zeros(3, dtype=torch.float64, device="cpu"), 0]


def _adopt(cls, mod: nn.Module):
    """A ``cls`` instance that holds ``mod``'s attributes, hooks and the same Parameter objects."""
    new = cls.__new__(cls)
    nn.Module.__init__(new)
    # Copy containers (hooks, buffer sets) so the two modules never share mutable state.
    new.__dict__.update({k: (copy.copy(v) if isinstance(v, (dict, set)) else v)
                         for k, v in mod.__dict__.items()
                         if k not in ("_parameters", "_buffers", "_modules")})
    new._parameters.update(mod._parameters)
    new._buffers.update(mod._buffers)
    new._modules.update(mod._modules)
    return new


class _HOTMixin:
    hot_config: HOTConfig
    hot_name: str
    hot_backend: Optional[str]

    @classmethod
    def from_module(cls, mod: nn.Module, config: HOTConfig, name: str = "",
                    backend: Optional[str] = None):
        """A HOT layer that shares ``mod``'s Parameters, buffers and hooks."""
        new = _adopt(cls, mod)
        new._hot_init(config, name, backend)
        return new

    @classmethod
    def convert_in_place(cls, mod: nn.Module, config: HOTConfig, name: str = "",
                         backend: Optional[str] = None):
        """Make ``mod`` itself a ``cls`` (a bare layer handed to hot.convert: the caller's
        reference must not silently stay an exact layer). ``cls`` is hot_class(type(mod))."""
        mod.__class__ = cls
        mod._hot_init(config, name, backend)
        return mod

    def _hot_init(self, config: HOTConfig, name: str, backend: Optional[str]) -> None:
        self._hot_set_config(config)
        self.hot_name = name
        self.hot_backend = backend
        self.hot_id = zlib.crc32(name.encode())
        dev = self.weight.device
        self.register_buffer("hot_step", torch.zeros((), dtype=torch.int64, device=dev))
        self.register_buffer("hot_lqs", torch.full((), LQS_UNDECIDED, dtype=torch.int8, device=dev))
        # LQS calibration: the summed statistics (hot.common.lqs, on the CPU) and the passes seen.
        self.hot_lqs_stats = _fresh_lqs_stats()
        self._hot_resolved: dict = {}
        # Python mirrors of the two persistent buffers: reading a CUDA buffer every step would
        # synchronize the GPU; writing it (fill_) does not.
        self._hot_step_value = 0
        self._hot_lqs_value = LQS_UNDECIDED
        self._hot_exact_phase = config.exact_at(0)
        self._hot_key = autograd.register(self)
        self._hot_hist: dict = {}
        self._hot_make_histories()

    def _hot_make_histories(self, dev: Optional[torch.device] = None,
                            config: Optional[HOTConfig] = None) -> None:
        """Zeroed histories for HLAConfig.amax = "delayed" (hot.nn.state.hla_history) on
        ``dev`` (default: the weight's) where there are none of the right size there, made
        when the config asks for them rather than at a layer's first pass: a first pass inside
        a CUDA graph's warm-up would otherwise allocate them from the graph's private pool.
        Not buffers (DDP would broadcast them every step): the state dict carries them as
        hot_hist_x / hot_hist_gy (_save_to_state_dict); _apply moves them with the module.
        ``config``: the config they are for (default: the layer's; a backward runs with its
        forward's)."""
        if (config or self.hot_config).hla.amax != "delayed":
            return
        dev = self.weight.device if dev is None else dev
        if dev.type == "meta":
            return
        hists = self.__dict__.setdefault("_hot_hist", {})  # (a layer pickled without them)
        for operand, n in ((ABC_X, self.hot_in_features()), (GY_HLA, self.weight.shape[0])):
            h = hists.get(operand)
            if h is None or h.device != dev or h.numel() != n:
                hists[operand] = torch.zeros(n, dtype=torch.float32, device=dev)

    def __setstate__(self, state):
        # deepcopy and unpickling land here: the copy is another layer with its own state, so it
        # needs its own key for the operators (a shared key would run the original's state).
        super().__setstate__(state)
        if "_hot_key" in self.__dict__:
            self._hot_key = autograd.register(self)
            # config keys are process-local: name the config again in this process
            self._hot_config_key = config_key(self._hot_run_config)

    def __reduce_ex__(self, protocol):
        # The HOT class of a subclass is made at run time (hot_class): pickle it as "the HOT
        # class of <original class>", which unpickling rebuilds.
        rv = super().__reduce_ex__(protocol)
        if type(self) in (HOTLinear, HOTConv2d) or rv[0] is not copyreg.__newobj__:
            return rv
        return (_new_hot_instance, (type(self)._hot_original,)) + tuple(rv[2:])

    def _apply(self, fn, recurse=True):
        # to_empty() after meta init leaves uninitialized memory in the buffers: write them from
        # the host's copies. (Other casts and moves keep their values; integer buffers are never
        # cast to a float dtype.)
        was_meta = "_hot_step_value" in self.__dict__ and self.hot_step.is_meta
        out = super()._apply(fn, recurse)
        if was_meta and not self.hot_step.is_meta:
            self.hot_step.fill_(self._hot_step_value)
            self.hot_lqs.fill_(self._hot_lqs_value)
        hists = self.__dict__.get("_hot_hist")
        if hists is not None:
            # Moved with the module; a cast to another dtype (model.half()) starts them afresh
            # (their contents only steer the next scale: zeros mean "take this pass's own").
            for k, h in list(hists.items()):
                h = fn(h)
                hists[k] = h if h.dtype == torch.float32 else torch.zeros(
                    h.shape, dtype=torch.float32, device=h.device)
            self._hot_make_histories()
        return out

    def hot_step_value(self) -> int:
        return self._hot_step_value

    def hot_advance_step(self) -> int:
        """Count one backward call; returns the step it was (0-based). The counter in device
        memory advances by a device operation (a CUDA graph replays it), the host's copy here."""
        step = self._hot_step_value
        # Plain attributes written through __dict__: nn.Module.__setattr__ looks through its
        # parameter, buffer and module tables first, on every backward of every layer.
        d = self.__dict__
        d["_hot_step_value"] = step + 1
        self.hot_step.add_(1)
        # The compile path traces this bool, not the step, so only the phase change recompiles.
        d["_hot_exact_phase"] = self.hot_config.exact_at(step + 1)
        return step

    def hot_in_features(self) -> int:
        """The width of the rows HOT quantizes for this layer's input: in_features, or
        C * kh * kw for a convolution."""
        return math.prod(self.weight.shape[1:])

    def hot_lqs_value(self) -> int:
        return self._hot_lqs_value

    def set_lqs(self, choice: int) -> None:
        """Set the LQS decision: -1 undecided (calibrate again), 0 per-tensor, 1 per-token."""
        if choice not in (-1, 0, 1):
            raise HOTLayerError(f"HOT layer {self.hot_name!r}: LQS choice {choice!r} must be -1, 0 or 1")
        self._hot_lqs_value = int(choice)
        self.hot_lqs.fill_(int(choice))
        if choice == LQS_UNDECIDED:
            self.hot_lqs_stats = _fresh_lqs_stats()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.hot_config.hla.amax != "delayed":
            return
        hists = self.__dict__.get("_hot_hist", {})
        for operand, name in HOT_HISTORIES.items():
            h = hists.get(operand)
            if h is not None:
                destination[prefix + name] = h if keep_vars else h.detach()

    def _hot_load_histories(self, state_dict, prefix, unexpected_keys, error_msgs) -> None:
        """The delayed histories from a state dict's hot_hist_x / hot_hist_gy, where the layer
        keeps histories (its config's amax is "delayed"; else they are not its state and are
        left). A state dict without them (a plain one, or one of amax "current") leaves the
        layer's. Written in place where the layer has them (a captured CUDA graph keeps
        reading the same memory)."""
        for operand, name in HOT_HISTORIES.items():
            key = prefix + name
            if key in unexpected_keys:
                unexpected_keys.remove(key)
            v = state_dict.get(key)
            if v is None or self.hot_config.hla.amax != "delayed":
                continue
            n = self.hot_in_features() if operand == ABC_X else self.weight.shape[0]
            if v.dim() != 1 or v.numel() != n or not v.dtype.is_floating_point:
                error_msgs.append(f"HOT layer {self.hot_name!r}: {key} must be {n} floats (one "
                                  f"per channel), got shape {tuple(v.shape)} {v.dtype}")
                continue
            self._hot_make_histories()
            h = self.__dict__.get("_hot_hist", {}).get(operand)
            if h is not None:  # (none on the meta device)
                with torch.no_grad():
                    h.copy_(v)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # A plain model's checkpoint has no hot_* buffers: the layer keeps its state. With them,
        # the state is read from the checkpoint's values (the mirrors first: load with
        # assign=True replaces the buffer objects themselves).
        for k, attr in (("hot_step", "_hot_step_value"), ("hot_lqs", "_hot_lqs_value")):
            v = state_dict.get(prefix + k)
            if v is not None and attr in self.__dict__:
                if v.numel() != 1 or v.dtype.is_floating_point:
                    error_msgs.append(f"HOT layer {self.hot_name!r}: {prefix + k} must be one "
                                      f"integer, got shape {tuple(v.shape)} {v.dtype}")
                    continue
                self.__dict__[attr] = int(v)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        for k in HOT_BUFFERS:
            if prefix + k in missing_keys:
                missing_keys.remove(prefix + k)
        if "_hot_step_value" in self.__dict__:
            self._hot_materialize_state()
            self._hot_load_histories(state_dict, prefix, unexpected_keys, error_msgs)
            if self.hot_step.device.type != "meta":
                self.hot_step.fill_(self._hot_step_value)
                self.hot_lqs.fill_(self._hot_lqs_value)
            if self._hot_lqs_value not in (-1, 0, 1):
                error_msgs.append(f"HOT layer {self.hot_name!r}: {prefix}hot_lqs = "
                                  f"{self._hot_lqs_value} is not -1, 0 or 1")
                self._hot_lqs_value = LQS_UNDECIDED
            self._hot_exact_phase = self.hot_config.exact_at(self._hot_step_value)

    def _hot_materialize_state(self) -> None:
        """After load_state_dict(..., assign=True) into a model built on the meta device from a
        checkpoint without HOT's buffers (a plain model's): the weights are real, HOT's buffers
        still meta. Make them on the weight's device; the caller writes the host copies in."""
        dev = self.weight.device
        if dev.type == "meta":
            return
        for k, dtype in (("hot_step", torch.int64), ("hot_lqs", torch.int8)):
            if self._buffers[k].device.type == "meta":
                self._buffers[k] = torch.zeros((), dtype=dtype, device=dev)

    def _backend_for(self, device: torch.device) -> str:
        key = (str(device), self.hot_backend)
        if key not in self._hot_resolved:
            self._hot_resolved[key] = resolve_backend(self.hot_backend, device, self.hot_name)
        return self._hot_resolved[key]

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dtype not in SUPPORTED_DTYPES:
            raise HOTLayerError(
                f"HOT layer {self.hot_name!r}: input dtype {x.dtype} is not supported; "
                f"use float32, bfloat16, float16 or float64 (e.g. x.float()), or exclude this layer "
                f"with hot.convert(..., module_filter_fn=...)."
            )
        if self.weight.dtype not in SUPPORTED_DTYPES:
            raise HOTLayerError(
                f"HOT layer {self.hot_name!r}: weight dtype {self.weight.dtype} is not supported; "
                f"use float32, bfloat16, float16 or float64 weights."
            )

    def _needs_backward(self, x: torch.Tensor) -> bool:
        """False in inference (no_grad, or nothing requires grad): then the plain op runs.
        Raises under torch.func transforms, which HOT's backward cannot take part in."""
        needs = torch.is_grad_enabled() and (
            x.requires_grad or self.weight.requires_grad
            or (self.bias is not None and self.bias.requires_grad))
        if needs and not torch.compiler.is_compiling() \
                and torch._C._are_functorch_transforms_active():
            raise HOTLayerError(
                f"HOT layer {self.hot_name!r}: torch.func transforms (vmap, grad, jacrev, "
                f"functional_call under them, ...) cannot differentiate through HOT's backward, "
                f"which keeps per-layer state (step counter, seeds, LQS) per call. Use ordinary "
                f"autograd (loss.backward()), run the transform under torch.no_grad() for "
                f"inference, or transform the plain model (hot.unconvert(model)).")
        return needs

    def _autocast(self, x, bias):
        """x and the bias as autocast would cast them. The weight is not cast here: the
        operators read it in its own dtype (the forward GEMM casts a transient copy, HQ
        quantizes W from it directly), so no autocast copy of W is kept for backward (on a
        1B-parameter model 2 GiB of bf16 copies) and g_W comes out in the weight's dtype (but
        on a split output layer: hot.nn.backward.gw_dtype)."""
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            dt = torch.get_autocast_dtype(dev)
            x = x.to(dt)
            bias = bias.to(dt) if bias is not None else None
        return x, bias

    def _hot_set_config(self, config: HOTConfig) -> None:
        """hot_config = ``config`` as given; what the layer runs is ``_hot_run_config``, the
        same with HLAConfig.selection "auto" resolved for this layer's type
        (HOTConfig.for_layer), named for the operators by ``_hot_config_key``."""
        self.hot_config = config
        self._hot_run_config = config.for_layer(isinstance(self, nn.Conv2d))
        self._hot_config_key = config_key(self._hot_run_config)

    @property
    def hot_run_config(self) -> HOTConfig:
        """hot_config as this layer runs it: HLAConfig.selection "auto" resolved for its type
        ("stratified" on a Linear layer, "lowpass" on a Conv2d)."""
        return self._hot_run_config

    def set_hot_config(self, config: HOTConfig) -> None:
        """A new config for the next forward; a backward still runs with its forward's."""
        self._hot_set_config(config)
        self._hot_exact_phase = config.exact_at(self._hot_step_value)
        self._hot_make_histories()

    def hot_extra_repr(self) -> str:
        c = self._hot_run_config
        return (f"hq_bits={c.hq.bits}, hla_rank={c.hla.rank}, hla_selection={c.hla.selection}, "
                f"hla_bits={c.hla.bits}, "
                f"lqs={self._hot_lqs_value}")


class HOTLinear(_HOTMixin, nn.Linear):
    @classmethod
    def from_linear(cls, mod: nn.Linear, config: HOTConfig, name: str = "",
                    backend: Optional[str] = None) -> "HOTLinear":
        return cls.from_module(mod, config, name, backend)

    def _check_features(self, x: torch.Tensor) -> None:
        self._check_input(x)
        if x.shape[-1] != self.in_features:
            raise HOTLayerError(
                f"HOT layer {self.hot_name!r}: input has {x.shape[-1]} features in its last "
                f"dimension, but the layer expects in_features={self.in_features}."
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_features(x)
        if not self._needs_backward(x):
            return nn.functional.linear(x, self.weight, self.bias)
        xc, b = self._autocast(x, self.bias)
        return autograd.linear(self, xc, self.weight, b, self._seq(xc),
                               x if xc.dtype != x.dtype else None)

    def _seq(self, x: torch.Tensor) -> int:
        """Rows per sequence (tokens) for blocking='sequence', else 0."""
        return x.shape[-2] if (self.hot_config.hla.blocking == "sequence" and x.dim() >= 3) else 0

    def extra_repr(self) -> str:
        return super().extra_repr() + ", " + self.hot_extra_repr()


class HOTConv2d(_HOTMixin, nn.Conv2d):
    @classmethod
    def from_conv(cls, mod: nn.Conv2d, config: HOTConfig, name: str = "",
                  backend: Optional[str] = None) -> "HOTConv2d":
        return cls.from_module(mod, config, name, backend)

    def _geom(self):
        pad = self.padding
        if isinstance(pad, str):
            pad = _resolve_padding(self)
        return (tuple(self.stride), tuple(pad), tuple(self.dilation))

    def _check_4d(self, x: torch.Tensor) -> None:
        self._check_input(x)
        if x.dim() != 4:
            raise HOTLayerError(
                f"HOT layer {self.hot_name!r}: HOTConv2d takes (N, C, H, W) or (C, H, W) input, "
                f"got shape {tuple(x.shape)}."
            )

    def _seq(self, x: torch.Tensor, w: torch.Tensor, geom) -> int:
        """Output positions per image for blocking='sequence', else 0."""
        if self.hot_config.hla.blocking != "sequence":
            return 0
        h, wd = autograd.conv_out_hw(x.shape, w.shape, *geom)
        return h * wd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 3:  # unbatched, as nn.Conv2d accepts
            return self.forward(x.unsqueeze(0)).squeeze(0)
        self._check_4d(x)
        if not self._needs_backward(x):
            return self._conv_forward(x, self.weight, self.bias)
        xc, b = self._autocast(x, self.bias)
        geom = self._geom()
        return autograd.conv2d(self, xc, self.weight, b, geom, self._seq(xc, self.weight, geom),
                               xc.dtype != x.dtype)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", " + self.hot_extra_repr()


def _resolve_padding(mod: nn.Conv2d) -> tuple[int, int]:
    if mod.padding == "valid":
        return (0, 0)
    # 'same' (stride 1): total padding d*(k-1) per side pair must split evenly for unfold.
    out = []
    for k, d in zip(mod.kernel_size, mod.dilation):
        total = d * (k - 1)
        if total % 2:
            raise HOTLayerError(f"padding='same' with an even effective kernel is asymmetric")
        out.append(total // 2)
    return tuple(out)


def conv_supported(mod: nn.Conv2d) -> Optional[str]:
    """None if HOTConv2d can replace ``mod``, else the reason it stays a standard layer."""
    if mod.groups != 1:
        return f"groups={mod.groups} (grouped/depthwise convolutions stay standard layers)"
    if mod.padding_mode != "zeros":
        return f"padding_mode={mod.padding_mode!r} (only 'zeros' is supported)"
    if isinstance(mod.padding, str) and mod.padding == "same":
        try:
            _resolve_padding(mod)
        except HOTLayerError:
            return "padding='same' with an even kernel (asymmetric padding)"
    return None


HOTLinear._hot_original = nn.Linear
HOTConv2d._hot_original = nn.Conv2d
_HOT_CLASSES: dict = {nn.Linear: HOTLinear, nn.Conv2d: HOTConv2d}


def hot_class(cls: type) -> type:
    """The HOT layer class for modules of class ``cls`` (nn.Linear, nn.Conv2d or a subclass that
    keeps the parent's forward): HOTLinear / HOTConv2d, or for a subclass a class derived from
    both, so the converted layer is still an instance of ``cls`` and keeps its other methods."""
    hot = _HOT_CLASSES.get(cls)
    if hot is None:
        base = HOTLinear if issubclass(cls, nn.Linear) else HOTConv2d
        hot = _HOT_CLASSES[cls] = type(f"HOT{cls.__name__}", (base, cls),
                                       {"__module__": __name__, "_hot_original": cls})
    return hot


def original_class(cls: type) -> type:
    """The class a HOT layer class was made for (what unconvert restores)."""
    return cls._hot_original


def _new_hot_instance(original: type):
    cls = hot_class(original)
    return cls.__new__(cls)
