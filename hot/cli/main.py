"""Entry point of the ``hot`` console script."""

from __future__ import annotations

import argparse
import sys
from typing import Optional

from . import argtypes as T
from . import bench, compare, demo, gbops, inspect, memory, train
from .errors import (EXIT_ERROR, EXIT_INTERRUPTED, UsageError, debug_enabled, describe,
                     print_traceback, report, usage_message)

EPILOG = """examples:
  hot demo                                  FP32 vs HOT on Fashion-MNIST, about 5 min on 2 CPU cores
  hot train --dataset mnist-5k --method hot --epochs 2
  hot train --model minilm --dataset rotten-tomatoes --method hot --lora-r 8
  hot memory vit_base_patch16_224 --batch 8 --input-shape 3,224,224
  hot gbops vit_base_patch16_224 --classes 100
  hot inspect tiny-vit --dataset mnist-5k
Every subcommand accepts --json. Nothing is downloaded: data and weights come from installed
packages or local paths (docs/cli.md). Errors exit with status 2 and one line on stderr;
--debug (or HOT_DEBUG=1) also prints the traceback."""


class HelpFormatter(argparse.HelpFormatter):
    """The one help formatter of every subcommand: descriptions wrapped, a text of several lines
    (the examples epilog) kept as written, and an option's default appended once, only where
    its help does not already state it."""

    def _fill_text(self, text, width, indent):
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action):
        text = action.help or ""
        if (action.default in (None, False, argparse.SUPPRESS) or "default" in text
                or action.nargs == argparse.REMAINDER):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors reach main() as UsageError (one line, exit status 2)
    instead of a usage block and SystemExit; its subparsers are Parsers too. Every one formats
    help with HelpFormatter, whatever a subcommand asks for, and takes no abbreviated options
    (--epoch must not silently mean --epochs)."""

    def __init__(self, *a, **kw):
        kw["formatter_class"] = HelpFormatter
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def _check_value(self, action, value):
        # argparse's own check, with the closest choice suggested (a typo in --dataset)
        if action.choices is not None and value not in action.choices:
            names = [str(c) for c in action.choices]
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{T.suggestion(str(value), names)}; choose "
                        f"from {', '.join(names)}.")
        super()._check_value(action, value)

    def error(self, message: str):
        raise UsageError(self.prog, usage_message(self.prog, message))


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hot", description="HOT (Hadamard-based Optimized Training): see it train, "
        "measure its memory, count its operations and inspect its gradients.",
        epilog=EPILOG)
    from .. import __version__

    p.add_argument("--version", action="version", version=f"hot {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for mod in (demo, train, compare, memory, gbops, inspect, bench):
        mod.add_parser(sub)
    for q in [p, *sub.choices.values()]:
        q.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="on an error, print the traceback before the one-line message "
                            "(also HOT_DEBUG=1)")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    """Run one subcommand; returns the exit status (0, 2 on any error, 130 on Ctrl-C)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argv[: argv.index("--")] if "--" in argv else argv  # after `--`: bench's / compare's
    as_json, debug = "--json" in own, debug_enabled(own)
    prog = "hot"
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        prog = f"hot {args.command}" if args.command else "hot"
        # What the command parsed, not a --json anywhere: `hot bench step --json PATH` gives
        # the benchmark a path, and its errors stay text.
        as_json = bool(getattr(args, "json", as_json))
        if extra:
            raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)}; see "
                                   f"`{prog} --help`.")
        if not args.command:
            parser.print_help()
            return EXIT_ERROR
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return report(prog, "interrupted.", as_json=as_json, kind="KeyboardInterrupt",
                      status=EXIT_INTERRUPTED)
    except UsageError as e:
        return report(e.prog, str(e), as_json=as_json, kind="UsageError")
    except Exception as e:
        if debug:
            print_traceback()
        return report(prog, describe(e), as_json=as_json, kind=type(e).__name__)


if __name__ == "__main__":
    sys.exit(main())
