"""The benchmark modules' argument parser. Run as `python -m hot.bench.X`, a benchmark reports a
bad argument as argparse does (usage block, exit status 2). Run by the hot command (`hot bench
NAME`), whose errors are one line with status 2, its main(argv, usage_error=...) receives what
to raise instead: hot.bench does not import hot.cli, so the caller supplies the exception."""

from __future__ import annotations

import argparse
import functools
from typing import Callable, NoReturn, Optional

# argparse's message (or a benchmark's own p.error(...) text) -> the exception to raise
UsageErrorFactory = Callable[[str], Exception]


class BenchParser(argparse.ArgumentParser):
    """An ArgumentParser whose error() raises ``usage_error(message)`` where one is given (for
    a type function's failure, a missing value, an unknown option and the module's own
    ``p.error(...)`` alike), and is argparse's own otherwise. Its subparsers share it."""

    def __init__(self, *args, usage_error: Optional[UsageErrorFactory] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.usage_error = usage_error

    def add_subparsers(self, **kwargs):
        # argparse builds subparsers as type(self)(**kw), which would drop usage_error
        kwargs.setdefault("parser_class",
                          functools.partial(type(self), usage_error=self.usage_error))
        return super().add_subparsers(**kwargs)

    def error(self, message: str) -> NoReturn:
        if self.usage_error is None:
            super().error(message)
        raise self.usage_error(message)
