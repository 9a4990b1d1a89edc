"""Per-layer gradient fidelity of HOT against exact gradients for the same g_y.

One exact forward/backward of the unconverted model records every Linear/Conv2d's input x and
output gradient g_y (hooks). Each layer is then copied, converted with ``hot.convert`` and run
on that x with g_y fed to its backward, twice: the first backward calibrates LQS (per-token
while calibrating), the second uses the layer's decision and is the one measured.

    SQNR (dB)       = 10 log10(||g||^2 / ||g_hot - g||^2)
    cosine          = <g, g_hot> / (||g|| ||g_hot||)
    effective bits  = SQNR / 6.02: the width of an ideal uniform quantizer whose quantization
                      noise alone would give this SQNR (each bit adds 20 log10(2) = 6.02 dB)

Where the exact gradient is exactly zero (no gradient reached the layer: its g_y is 0, as behind
a BatchNorm whose weight starts at zero) the three are undefined and reported as None, with
HOT's gradient norm beside them; a HOT gradient that is zero against a non-zero exact one has
SQNR 0 dB and no cosine. NaN or Inf in either gradient raises FloatingPointError naming the
layer and the gradient: it is never averaged away or shown as a number.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
import torch.nn as nn

import hot

LQS_NAMES = {-1: "undecided", 0: "per-tensor", 1: "per-token"}


def compare(exact: torch.Tensor, approx: torch.Tensor, what: str = "gradient") -> dict:
    """SQNR, cosine and effective bits of ``approx`` (HOT's ``what``) against ``exact``, with
    HOT's norm; the three are None where ``exact`` is all zero (see the module docstring)."""
    e, a = exact.double().flatten(), approx.double().flatten()
    if not torch.isfinite(e).all():
        raise FloatingPointError(f"the exact {what} holds NaN/Inf")
    if not torch.isfinite(a).all():
        raise FloatingPointError(f"HOT's {what} holds NaN/Inf (the exact one is finite)")
    sig, err, hot_sq = float(e @ e), float((a - e) @ (a - e)), float(a @ a)
    out = {"sqnr_db": None, "cosine": None, "effective_bits": None, "exact_zero": sig == 0,
           "hot_norm": math.sqrt(hot_sq)}
    if sig == 0:
        return out
    sqnr = math.inf if err == 0 else 10 * math.log10(sig / err)
    out.update(sqnr_db=sqnr, effective_bits=sqnr / 6.02,
               cosine=float(e @ a) / math.sqrt(sig * hot_sq) if hot_sq > 0 else None)
    return out


def capture(model: nn.Module, loss_fn) -> dict:
    """{fqn: (x, g_y)} for every Linear/Conv2d from one exact backward of ``loss_fn(model)``."""
    rec: dict = {}
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Linear, nn.Conv2d)):
            def fwd(m, args, out, name=name):
                rec.setdefault(name, {})["x"] = args[0].detach().clone()

            def bwd(m, gin, gout, name=name):
                rec.setdefault(name, {})["gy"] = gout[0].detach().clone()

            handles += [mod.register_forward_hook(fwd), mod.register_full_backward_hook(bwd)]
    try:
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            # The first layer's input needs no gradient; its g_y is still what we want.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss_fn(model).backward()
    finally:
        for h in handles:
            h.remove()
    return {k: (v["x"], v["gy"]) for k, v in rec.items() if "x" in v and "gy" in v}


def layer_fidelity(layer: nn.Module, x: torch.Tensor, gy: torch.Tensor, config,
                   backend=None) -> dict:
    """HOT vs exact g_x and g_W of one layer for input x and output gradient g_y;
    ``no_gradient`` is True where g_y is all zero."""
    exact_layer = copy.deepcopy(layer)
    xe = x.clone().requires_grad_(True)
    exact_layer.zero_grad(set_to_none=True)
    exact_layer(xe).backward(gy)
    wrapper = nn.Sequential(copy.deepcopy(layer))
    hot.convert(wrapper, config, backend=backend)
    hl = wrapper[0]
    if not isinstance(hl, (hot.HOTLinear, hot.HOTConv2d)):
        return {"converted": False}
    for _ in range(2):  # 1st: LQS calibration; 2nd: the decided scaling, the one reported
        xh = x.clone().requires_grad_(True)
        hl.zero_grad(set_to_none=True)
        hl(xh).backward(gy)
    return {"converted": True, "lqs": LQS_NAMES.get(int(hl.hot_lqs), str(int(hl.hot_lqs))),
            "no_gradient": not bool(gy.any()),
            "g_x": compare(xe.grad, xh.grad, "g_x"),
            "g_W": compare(exact_layer.weight.grad, hl.weight.grad, "g_W")}


def model_fidelity(model: nn.Module, loss_fn, config, backend=None, progress=None) -> list[dict]:
    """layer_fidelity for every Linear/Conv2d of ``model`` (unconverted), on one batch."""
    rec = capture(model, loss_fn)
    mods = dict(model.named_modules())
    rows = []
    items = list(rec.items())
    for name, (x, gy) in (progress(items) if progress else items):
        mod = mods[name]
        if not mod.weight.requires_grad:
            continue
        try:
            r = layer_fidelity(mod, x, gy, config, backend)
        except FloatingPointError as e:
            raise FloatingPointError(f"layer {name}: {e}") from e
        rows.append({"layer": name, "shape": list(mod.weight.shape), **r})
    return rows
