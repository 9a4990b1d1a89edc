"""What the tools (hot.cli, hot.bench) share to write results: JSON that every parser reads,
and matplotlib for their figures. It lives below both so that neither imports the other's
helpers (the hot command runs the benchmarks and the study, never the reverse)."""

from __future__ import annotations

import math
import pathlib
import sys


def finite(o):
    """``o`` with every non-finite float written as a string, through dicts, lists and tuples:
    JSON has no Infinity or NaN, and a record must stay readable by every parser."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


def pyplot(path: pathlib.Path):
    """matplotlib.pyplot on the Agg backend (no display needed), or None after a note on
    stderr naming ``path`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"note: {path} not drawn: matplotlib is not installed (pip install matplotlib, "
              f"or install hot with its cli extra).", file=sys.stderr, flush=True)
        return None
    return plt
