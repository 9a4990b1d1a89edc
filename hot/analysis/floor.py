"""What HOT's quantizer passes must move in one training step, and the integer GEMM work: the
terms of the floor a step's GPU time cannot go below (benchmarks/step_floor.py,
docs/performance.md "Floors of the end-to-end targets").

Bytes per HOT layer of shape (L, O, I) (hot.analysis.shapes), r of 16 HLA coefficients kept,
L16 = ceil(L / 16) blocks of tokens, O16 = O padded to a multiple of 16, one byte per code:

    g_y pass  read g_y (L x O, bf16); write its HQ codes (L x O16) if the layer's input needs a
              gradient, and its HLA codes (O x L16 r) if its weight does
    ABC pass  read x (L x I, bf16); write its codes (I x L16 r), if the weight needs a gradient
    W pass    read W (O x I, bf16); write its HQ codes (I x O16), if the input needs a gradient

and integer operations (2 per multiply-add): g_x = (L x O16)(O16 x I), g_W = (O x L16 r)(L16 r x I).
With the quantized forward (HOTConfig(forward="int8")), I16 = I padded to a multiple of 16:

    x pass    the ABC pass also writes x's HQ codes (L x I16): one read of x for both
    W pass    read W (O x I, bf16) once more; write its forward HQ codes (O x I16)

and the forward GEMM y = (L x I16)(I16 x O).

Each pass is counted in two forms. As specified, a scale is the absmax of a whole row (HQ, per
token) or a whole column (HLA, per channel), so no code can be written before the whole input
has been read: the input is read twice, the second time from DRAM for all that exceeds the L2.
Read once: a quantizer whose scales need no second read. And each form once more with one ABC
pass per input tensor that several layers read (``LayerShape.source``: q, k and v; gate and
up), writing every such layer's codes.
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

from .shapes import LayerShape


class PassBytes(NamedTuple):
    """DRAM bytes of one step's passes in each form, and the HOT GEMMs' integer operations."""

    spec: float
    one_read: float
    spec_shared: float
    one_read_shared: float
    gemm_ops: float


def pass_bytes(shapes: Iterable[LayerShape], rank: int, l2_bytes: float,
               qfwd: bool = False) -> PassBytes:
    """The PassBytes of the HOT layers ``shapes`` with HLA rank ``rank`` and an L2 of
    ``l2_bytes``; ``qfwd``: with the quantized forward (module docstring)."""

    def cost(read, write):  # (read once, as specified)
        return read + write, read + write + max(0.0, read - l2_bytes)

    def add(t, c):
        return t[0] + c[0], t[1] + c[1]

    rest = abc = shared = (0.0, 0.0)
    ops = 0.0
    # input -> [bytes of one read of it, ABC codes written for it, its forward HQ codes]; the
    # HQ codes (per-token scales: x's own) serve every layer that reads x
    by_source: dict = {}
    for i, s in enumerate(shapes):
        L, O, I = s.L, s.O, s.I
        lr = math.ceil(L / 16) * rank
        o16, i16 = math.ceil(O / 16) * 16, math.ceil(I / 16) * 16
        need_x, need_w = s.input_requires_grad, s.trainable
        rest = add(rest, cost(2 * L * O, (L * o16 if need_x else 0) + (O * lr if need_w else 0)))
        if need_x:
            rest = add(rest, cost(2 * O * I, I * o16))
            ops += 2 * L * o16 * I
        x_codes = L * i16 if qfwd else 0
        if qfwd:
            rest = add(rest, cost(2 * O * I, O * i16))
            ops += 2 * L * O * i16
        if need_w or qfwd:
            abc = add(abc, cost(2 * L * I, (I * lr if need_w else 0) + x_codes))
            key = ("layer", i) if s.source is None else ("source", s.source)
            entry = by_source.setdefault(key, [2 * L * I, 0, 0])
            entry[1] += I * lr if need_w else 0
            entry[2] = x_codes
        if need_w:
            ops += 2 * O * I * lr
    for read, codes, x_codes in by_source.values():
        shared = add(shared, cost(read, codes + x_codes))
    return PassBytes(rest[1] + abc[1], rest[0] + abc[0], rest[1] + shared[1], rest[0] + shared[0],
                     ops)
