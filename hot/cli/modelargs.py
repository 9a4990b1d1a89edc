"""Model options shared by memory, gbops and inspect (the spec, classes, a synthetic batch and
its loss), and the checks that a model spec fits its input, made before anything is built."""

from __future__ import annotations

import pathlib
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..data import LM_DATASETS
from ..data.lm import IGNORE
from ..models import build_model, describe_model_spec
from ..models.llama import LLAMA_PRESETS
from ..models.registry import BuiltModel, build_lm, is_lm_spec
from . import argtypes as T
from .common import CLIError
from .trainer import logits_of

LM_VOCAB = 32000  # the synthetic tokens' vocabulary of a Llama preset without its own (llama-tiny)

TINY_VIT_PATCH, TINY_VIT_HEADS = 4, 4  # what build_model gives tiny-vit unless told otherwise


def add_model_args(p) -> None:
    p.add_argument("model", nargs="?", default="tiny-vit", help=describe_model_spec())
    p.add_argument("--batch", type=T.positive_int, default=8, help="batch size N")
    p.add_argument("--input-shape", type=T.image_shape, default=None,
                   help="C,H,W of one image (default 1,28,28 for tiny-vit, 3,224,224 for timm)")
    p.add_argument("--seq-len", type=T.positive_int, default=128,
                   help="tokens per text example (HF models and Llama presets)")
    p.add_argument("--vocab", type=T.positive_int, default=None,
                   help=f"vocabulary of a Llama preset's synthetic tokens (default: the "
                        f"preset's; {LM_VOCAB} for llama-tiny, which has none of its own)")
    p.add_argument("--classes", type=T.positive_int, default=10, help="classifier outputs")
    p.add_argument("--vit-dim", type=T.positive_int, default=128,
                   help="tiny-vit width (a multiple of its 4 heads)")
    p.add_argument("--vit-depth", type=T.positive_int, default=6, help="tiny-vit blocks")


def model_kind(spec: str) -> str:
    """'lm' for a Llama preset, 'text' for minilm and HuggingFace directories, else 'image'
    (tiny-vit, timm names)."""
    if is_lm_spec(spec):
        return "lm"
    return "text" if spec == "minilm" or pathlib.Path(spec).is_dir() else "image"


def check_fits(spec: str, model_flag: str, data) -> None:
    """CLIError unless the model spec and the loaded dataset are both text or both images."""
    if model_kind(spec) == "lm":
        raise CLIError(f"{model_flag} {spec} is a causal language model, and --dataset "
                       f"{data.name} is for classifiers: train it on --dataset "
                       f"{', '.join(LM_DATASETS)}, or pick a classifier (tiny-vit, minilm, timm).")
    if data.kind == "lm":
        raise CLIError(f"--dataset {data.name} holds token sequences for a causal language "
                       f"model: pick a Llama preset ({', '.join(LLAMA_PRESETS)}) for it, or a "
                       f"classifier dataset for {model_flag} {spec}.")
    if model_kind(spec) != data.kind:
        raise CLIError(f"{model_flag} {spec} and --dataset {data.name} do not fit together: "
                       f"text datasets need a HuggingFace text model (e.g. minilm), image "
                       f"datasets an image model (tiny-vit or a timm name).")


def check_tiny_vit(shape: tuple, dim: int, size_flag: str) -> None:
    """CLIError unless tiny-vit can be built for images of ``shape`` (C, H, W) and width
    ``dim``; ``size_flag`` names the option that set the image size, for the message."""
    _, h, w = shape
    if h != w:
        raise CLIError(f"{size_flag}: tiny-vit needs square images, got {h}x{w}; give equal "
                       f"height and width.")
    if h % TINY_VIT_PATCH:
        up = h + TINY_VIT_PATCH - h % TINY_VIT_PATCH
        raise CLIError(f"{size_flag}: tiny-vit cuts {TINY_VIT_PATCH}x{TINY_VIT_PATCH} patches, "
                       f"so the image side must be a multiple of {TINY_VIT_PATCH}, not {h}; "
                       f"e.g. {up}.")
    if dim % TINY_VIT_HEADS:
        up = dim + TINY_VIT_HEADS - dim % TINY_VIT_HEADS
        raise CLIError(f"--vit-dim {dim}: tiny-vit has {TINY_VIT_HEADS} attention heads, so its "
                       f"width must be a multiple of {TINY_VIT_HEADS}; e.g. {up}.")


def analysis_shape(args) -> Optional[tuple]:
    """The image shape memory, gbops and inspect use: --input-shape, else 1,28,28 for
    tiny-vit and 3,224,224 for timm; None for text models and Llama presets."""
    if model_kind(args.model) != "image":
        return None
    if args.input_shape:
        return tuple(args.input_shape)
    return (1, 28, 28) if args.model == "tiny-vit" else (3, 224, 224)


class AnalysisModel(NamedTuple):
    """What memory, gbops and inspect run: the model, its image shape (None for tokens), a
    synthetic batch and the training loss on a batch."""

    built: BuiltModel
    shape: Optional[tuple]
    make: Callable[[torch.device, torch.Generator], tuple]  # (device, generator) -> (x, y)
    loss: Callable[[nn.Module, object, torch.Tensor], torch.Tensor]  # (model, x, y) -> loss


def classifier_loss(model: nn.Module, x, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits on ``x`` against the labels ``y``, in float32."""
    return F.cross_entropy(logits_of(model, x).float(), y)


def next_token_loss(model: nn.Module, x: dict, y: torch.Tensor) -> torch.Tensor:
    """hot train's lm_loss on the batch's token ids: ``y`` holds each position's next token,
    IGNORE at the last."""
    from .lmtrain import lm_loss

    return lm_loss(model, x["input_ids"], y)


def _lm_for_analysis(args) -> AnalysisModel:
    """A freshly initialised Llama preset on random tokens: --batch sequences of --seq-len."""
    preset = LLAMA_PRESETS[args.model]
    if getattr(args, "input_shape", None):
        raise CLIError(f"--input-shape is for image models; {args.model} reads tokens: give "
                       f"--batch and --seq-len instead.")
    if args.seq_len < 2:
        raise CLIError(f"--seq-len {args.seq_len}: a causal LM needs at least 2 tokens.")
    vocab = args.vocab or preset["vocab"] or LM_VOCAB
    built = build_lm(args.model, vocab=vocab, seq=max(args.seq_len, preset["seq"]))

    def make(device, gen):
        ids = torch.randint(0, vocab, (args.batch, args.seq_len), generator=gen)
        y = torch.cat([ids[:, 1:], torch.full((args.batch, 1), IGNORE)], 1)
        return {"input_ids": ids.to(device)}, y.to(device)
    return AnalysisModel(built, None, make, next_token_loss)


def build_for_analysis(args, shape: Optional[tuple] = None) -> AnalysisModel:
    """The model, image shape, synthetic batch and loss of memory, gbops and inspect (a
    classifier's cross-entropy, or a Llama preset's next-token loss). ``shape`` overrides
    analysis_shape(args) (inspect takes it from its dataset)."""
    if model_kind(args.model) == "lm":
        return _lm_for_analysis(args)
    shape = shape or analysis_shape(args)
    if args.model == "tiny-vit":
        flag = ("--input-shape " + ",".join(map(str, args.input_shape)) if args.input_shape
                else f"the {shape[1]}x{shape[2]} images")
        check_tiny_vit(shape, args.vit_dim, flag)
    built = build_model(args.model, classes=args.classes, input_shape=shape,
                        vit_dim=args.vit_dim, vit_depth=args.vit_depth)
    if built.kind == "text":
        vocab = getattr(built.model.config, "vocab_size", 1000)

        def make(device, gen):
            ids = torch.randint(1000 if vocab > 2000 else 0, vocab, (args.batch, args.seq_len),
                                generator=gen)
            x = {"input_ids": ids.to(device),
                 "attention_mask": torch.ones_like(ids).to(device)}
            return x, torch.randint(0, args.classes, (args.batch,), generator=gen).to(device)
        return AnalysisModel(built, None, make, classifier_loss)

    def make(device, gen):
        x = torch.randn((args.batch, *shape), generator=gen).to(device)
        return x, torch.randint(0, args.classes, (args.batch,), generator=gen).to(device)
    return AnalysisModel(built, shape, make, classifier_loss)
