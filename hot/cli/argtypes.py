"""argparse ``type=`` functions: every numeric option is checked when the command line is parsed,
before anything is loaded, trained or written.

argparse prefixes each message with the option ("argument --epochs: ..."), so a message here
says what the value is and what to give instead. Messages are full sentences ending in a period;
hot.cli.main relies on that to tell them from argparse's own messages, which get a pointer to
--help.
"""

from __future__ import annotations

import argparse
import difflib
import math
from ..common.config import VALID_RANKS
from .. import recipes


def _int(v: str) -> int:
    try:
        return int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a whole number; give one, e.g. 8.")


def _float(v: str) -> float:
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number; give one, e.g. 0.001.")
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{v!r} is not a finite number; give one, e.g. 0.001.")
    return x


def _bounded(name: str, parse, ok, message, doc: str):
    """A ``type=`` function called ``name``: ``parse`` the text, then ArgumentTypeError with
    ``message(text, value)`` unless ``ok(value)``."""
    def check(v: str):
        x = parse(v)
        if not ok(x):
            raise argparse.ArgumentTypeError(message(v, x))
        return x

    check.__name__ = check.__qualname__ = name
    check.__doc__ = doc
    return check


positive_int = _bounded(
    "positive_int", _int, lambda n: n >= 1, lambda v, n: f"{n} is below 1; give 1 or more.",
    "An integer of 1 or more (sizes, counts, epochs).")
nonnegative_int = _bounded(
    "nonnegative_int", _int, lambda n: n >= 0, lambda v, n: f"{n} is negative; give 0 or more.",
    "An integer of 0 or more (0 = off: warm-up steps, LoRA rank, --top).")
positive_float = _bounded(
    "positive_float", _float, lambda x: x > 0,
    lambda v, x: f"{v} is not above 0; give a number above 0, e.g. 0.001.",
    "A finite number above 0 (learning rate).")
nonnegative_float = _bounded(
    "nonnegative_float", _float, lambda x: x >= 0,
    lambda v, x: f"{v} is negative; give 0 or more.", "A finite number of 0 or more (weight decay).")
unit_fraction = _bounded(
    "unit_fraction", _float, lambda x: 0 < x <= 1,
    lambda v, x: f"{v} is outside (0, 1]; give a number above 0 and at most 1, e.g. 0.5.",
    "A number in (0, 1] (the LQS ratio).")


def hla_rank(v: str) -> int:
    """One of the HLA ranks HOT supports (rows kept of every 16-point Walsh block)."""
    n = _int(v)
    if n not in VALID_RANKS:
        raise argparse.ArgumentTypeError(
            f"{n} is not a supported rank; give one of {', '.join(map(str, VALID_RANKS))} "
            f"(Walsh rows kept of every 16; 16 = no low rank).")
    return n


def bits(v: str):
    """4 or 8 (operand width), or none/off/0 for no quantization on that path."""
    if v.lower() in ("none", "off", "0"):
        return None
    if v not in ("4", "8"):
        raise argparse.ArgumentTypeError(f"{v!r} is not a supported width; give 4, 8 or none.")
    return int(v)


def hq_bits(v: str):
    """bits(), or auto (HQConfig's default: 4 where the GPU has INT4 tensor cores, else 8)."""
    if v.lower() == "auto":
        return "auto"
    try:
        return bits(v)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a supported width; give auto, 4, 8 or "
                                         f"none.") from None


def image_shape(v: str) -> tuple[int, int, int]:
    """C,H,W of one image (also CxHxW), each 1 or more."""
    try:
        t = tuple(int(x) for x in v.replace("x", ",").split(","))
    except ValueError:
        t = ()
    if len(t) != 3 or min(t) < 1:
        raise argparse.ArgumentTypeError(f"{v!r} is not C,H,W of one image; give three "
                                         f"positive sizes, e.g. 3,224,224.")
    return t


def method_list(v: str) -> list[str]:
    """Comma-separated names of registered recipes (hot.recipes), at least one, each once (a
    name given twice would run twice into one folder: refused)."""
    names = [m.strip() for m in v.split(",") if m.strip()]
    if not names:
        raise argparse.ArgumentTypeError(
            f"no method in {v!r}; give a comma-separated list of {', '.join(recipes.names())}.")
    for m in names:
        try:
            recipes.get(m)  # its error names the value, the choices and the closest name
        except recipes.RecipeError as e:
            raise argparse.ArgumentTypeError(str(e))
    twice = [m for m in dict.fromkeys(names) if names.count(m) > 1]
    if twice:
        raise argparse.ArgumentTypeError(f"{v!r} lists {twice[0]!r} twice; give each method "
                                         f"once.")
    return names


def suggestion(name: str, known) -> str:
    """' (did you mean 'x'?)' for the closest of the ``known`` names (difflib), or ''."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def sequence_length(v: str) -> int:
    """Tokens per sequence: 2 or more ([CLS] and one token; a causal LM predicts the second
    from the first)."""
    n = _int(v)
    if n < 2:
        raise argparse.ArgumentTypeError(f"{n} is below 2; a sequence needs at least 2 tokens, "
                                         f"give 2 or more (e.g. 64).")
    return n


def _parts(v: str, empty: str) -> tuple[str, ...]:
    """The comma-separated non-empty parts of v, each once; ``empty`` is the error's text when
    there is none."""
    parts = tuple(dict.fromkeys(p.strip() for p in v.split(",") if p.strip()))
    if not parts:
        raise argparse.ArgumentTypeError(f"{v!r} {empty}")
    return parts


def name_list(v: str) -> tuple[str, ...]:
    """Comma-separated non-empty parts of layer names, each once."""
    return _parts(v, "names no layer; give parts of layer names, e.g. attn or qkv,proj.")


def pattern_list(v: str) -> tuple[str, ...]:
    """Comma-separated non-empty layer-name patterns, each once."""
    return _parts(v, "holds no pattern; give layer-name patterns, e.g. head or blocks.0.*,head.")
