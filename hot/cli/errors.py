"""How the ``hot`` command reports a failure: exit status 2 and one line on stderr,
``hot <command>: error: <what went wrong>; <what to do>``, plus, with --json, one JSON object on
stdout. A failure the command did not foresee (a bug) gets the same one line, with a pointer to
--debug / HOT_DEBUG=1, which print the traceback first."""

from __future__ import annotations

import json
import sys
import traceback

import torch

from .common import CLIError

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class UsageError(CLIError):
    """A command line argparse rejected; ``prog`` is the (sub)command's name ("hot train")."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


def usage_message(prog: str, message: str) -> str:
    """argparse's message as the CLI's one line: hot.cli.argtypes' are sentences that say what
    to give; argparse's own (an unknown option, a missing value) do not, so they point to
    --help."""
    if not message.endswith(".") and "choose from" not in message:
        message += f"; see `{prog} --help`."
    return message


def debug_enabled(argv: list[str]) -> bool:
    """--debug on the command line, or HOT_DEBUG=1: show tracebacks."""
    from ..common.options import options

    return "--debug" in argv or options().debug


def _expected() -> tuple:
    """Exception types whose message is written for the user (says what to do)."""
    from ..common.backend import BackendUnavailableError
    from ..common.config import HOTConfigError
    from ..data.base import DataUnavailableError
    from ..models.registry import ModelError
    from ..nn.modules import HOTLayerError

    return (CLIError, DataUnavailableError, ModelError, HOTConfigError, HOTLayerError,
            BackendUnavailableError, FloatingPointError, ValueError)


def describe(e: BaseException) -> str:
    """The one-line message for an exception that ended a command."""
    if isinstance(e, (torch.cuda.OutOfMemoryError, MemoryError)):
        return ("out of memory; use a smaller batch (--batch / --batch-size) or model, or a "
                "device with more memory.")
    if isinstance(e, ModuleNotFoundError) and e.name and not e.name.startswith("hot"):
        return (f"the Python package {e.name!r} is not installed; install it (pip install "
                f"{e.name.split('.')[0]}), or install hot with the extra that brings it "
                f"(docs/cli.md).")
    if isinstance(e, _expected()):
        return one_line(str(e))
    if isinstance(e, OSError) and e.strerror:
        where = f" {e.filename}" if e.filename else ""
        return f"cannot use{where}: {e.strerror}; check the path and its permissions."
    return (f"unexpected {type(e).__name__}: {one_line(str(e))} (a bug in hot: please report "
            f"it; rerun with --debug or HOT_DEBUG=1 for the traceback).")


def one_line(msg: str) -> str:
    return " ".join(msg.split())


def report(prog: str, message: str, *, as_json: bool, kind: str,
           status: int = EXIT_ERROR) -> int:
    """Print the failure (stderr line, and the JSON object with --json); returns ``status``."""
    if as_json:
        print(json.dumps({"error": message, "type": kind, "command": prog,
                          "exit_status": status}))
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return status


def print_traceback() -> None:
    traceback.print_exc(file=sys.stderr)
