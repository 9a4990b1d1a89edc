"""Training memory: measured saved bytes next to an analytic model, per layer and in total.

Analytic model (bytes), for a model trained with AdamW and fp32 master weights:

    weights    = 4 P           (P = trainable + frozen parameter count; bf16 autocast keeps fp32 weights)
    gradients  = 4 P_t         (P_t = trainable parameters)
    optimizer  = 8 P_t         (AdamW: exp_avg and exp_avg_sq in fp32)
    activations saved by each Linear/Conv2d GEMM of shape (L, O, I) (see hot.analysis.shapes),
    only where its weight or its input needs a gradient:
      fp32      4 X                          (the input x; X = its element count, L I for a Linear,
                                              B C H W for a Conv2d)
      bf16      2 X + 2 O I                  (bf16 copies of x and of W)
      hot       b ceil(L/16) r I + 4 I       (ABC: the HLA-projected input at b bytes per value,
                                              b = 1 for 8/4-bit codes, 4 unquantized, + fp32 scales;
                                              for a Conv2d the rows are im2col patches, I = C kh kw,
                                              so a 3x3 stride-1 conv keeps 9/8 of fp32's bytes at r=8)
      hot-bf16  hot                          (HOT layers keep no autocast copy of W: they read W
                                              in its own dtype; the layers HOT leaves standard,
                                              grouped convs, as bf16)
    A frozen weight (LoRA base layer) saves no ABC copy under HOT (no g_W) and no x under FP.
    An input that two layers read (a ResNet block's conv1 and its downsample) is one storage:
    measured once, but modelled once per layer.

Activations of other operations (norms, GELU, attention, residual adds) are not modelled;
the measured column includes them as '<other>'. Where a layer's input is a view of a larger
tensor (timm's head reads x[:, 0] of all tokens), autograd keeps the whole storage alive and the
measurement shows it; the model counts only the view (HOT's ABC copy does not keep it). The official calculator's errors are avoided:
qkv parameters are counted once, and saved *inputs* at their stored width are counted, not
layer outputs at 4 bits.
"""

from __future__ import annotations

import math

import torch.nn as nn

from .shapes import LayerShape


def analytic_layer_bytes(s: LayerShape, method: str, rank: int = 8, hla_bits=8,
                         input_needs_grad: bool = True, drawn: bool = False) -> int:
    """Analytic bytes that layer ``s`` saves for backward under ``method``; ``drawn``: HLA's
    rows are drawn (HLAConfig.selection "stratified"), so the forward also keeps an 8-byte copy
    of its step counter beside the codes."""
    if s.kind == "conv" and s.groups != 1 and method.startswith("hot"):
        method = "fp32" if method == "hot" else "bf16"  # HOT leaves grouped convs standard
    w_grad = s.trainable
    if method == "fp32":
        return 4 * s.x_numel if w_grad else 0
    # autograd's convolution saves its (cast) weight even when the input needs no gradient;
    # linear saves it only for g_x.
    keeps_w = input_needs_grad or s.kind == "conv"
    if method == "bf16":
        return (2 * s.x_numel if w_grad else 0) + (2 * s.O * s.I if keeps_w else 0)
    if method in ("hot", "hot-bf16"):
        per = 1 if hla_bits else 4
        return per * math.ceil(s.L / 16) * rank * s.I + 4 * s.I + 8 * drawn if w_grad else 0
    raise ValueError(f"no analytic memory model for method {method!r}")


def state_bytes(model: nn.Module) -> dict:
    """Weights, gradients and AdamW state in bytes (fp32 master copies)."""
    p_all = sum(p.numel() for p in model.parameters())
    p_tr = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"params": p_all, "trainable_params": p_tr, "weights": 4 * p_all,
            "gradients": 4 * p_tr, "optimizer": 8 * p_tr}
