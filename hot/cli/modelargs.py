"""Model options shared by memory, gbops and inspect: the spec, classes, and a synthetic batch."""

from __future__ import annotations

import torch

from ..models import build_model, describe_model_spec
from .common import CLIError


def add_model_args(p, default_shape: str = None) -> None:
    p.add_argument("model", nargs="?", default="tiny-vit", help=describe_model_spec())
    p.add_argument("--batch", type=int, default=8, help="batch size N")
    p.add_argument("--input-shape", default=default_shape,
                   help="C,H,W of one image (default 1,28,28 for tiny-vit, 3,224,224 for timm)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per text example (HF models)")
    p.add_argument("--classes", type=int, default=10, help="classifier outputs")
    p.add_argument("--vit-dim", type=int, default=128, help="tiny-vit width")
    p.add_argument("--vit-depth", type=int, default=6, help="tiny-vit blocks")


def parse_shape(s: str) -> tuple:
    try:
        t = tuple(int(v) for v in s.replace("x", ",").split(","))
    except ValueError:
        t = ()
    if len(t) != 3 or min(t) <= 0:
        raise CLIError(f"--input-shape {s!r}: give C,H,W of one image, e.g. 3,224,224.")
    return t


def build_for_analysis(args):
    """(built model, input shape or None, make_batch(device) -> (x, y))."""
    shape = None
    if args.input_shape:
        shape = parse_shape(args.input_shape)
    elif args.model == "tiny-vit":
        shape = (1, 28, 28)
    elif args.model != "minilm":
        shape = (3, 224, 224)
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
        return built, None, make

    def make(device, gen):
        x = torch.randn((args.batch, *shape), generator=gen).to(device)
        return x, torch.randint(0, args.classes, (args.batch,), generator=gen).to(device)
    return built, shape, make
