"""Entry point of the ``hot`` console script."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from . import bench, demo, gbops, inspect, memory, train
from .common import CLIError

EPILOG = """examples:
  hot demo                                  FP32 vs HOT on Fashion-MNIST, about 3 min on 2 CPU cores
  hot train --dataset mnist-5k --method hot --epochs 2
  hot train --model minilm --dataset rotten-tomatoes --method hot --lora-r 8
  hot memory vit_base_patch16_224 --batch 8 --input-shape 3,224,224
  hot gbops vit_base_patch16_224 --classes 100
  hot inspect tiny-vit --dataset mnist-5k
Every subcommand accepts --json. Nothing is downloaded: data and weights come from installed
packages or local paths (docs/cli.md)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hot", description="HOT (Hadamard-based Optimized Training): see it train, "
        "measure its memory, count its operations and inspect its gradients.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    from .. import __version__

    p.add_argument("--version", action="version", version=f"hot {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in (demo, train, memory, gbops, inspect, bench):
        mod.add_parser(sub)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..common.backend import BackendUnavailableError
    from ..common.config import HOTConfigError
    from ..data.base import DataUnavailableError
    from ..models.registry import ModelError
    from ..nn.modules import HOTLayerError

    try:
        return int(args.func(args) or 0)
    except (CLIError, DataUnavailableError, ModelError, HOTConfigError, HOTLayerError,
            BackendUnavailableError, FloatingPointError, ValueError) as e:
        msg = str(e)
        if getattr(args, "json", False):
            print(json.dumps({"error": msg, "type": type(e).__name__}))
        print(f"hot {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
