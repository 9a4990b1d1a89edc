"""LQS (layer-wise quantizer selection): the statistic that chooses per-token or per-tensor
scaling of g_y on the g_x path, and the decision rule. Backend-independent.

For the HQ-transformed g_y, t = hq_transform(g_y) (L x O16), and b-bit stochastic rounding, the
expected squared error of a row t_i under a scale s is E_i(s) = s^2 sum_j f_ij (1 - f_ij) with
f_ij = frac(t_ij / s) (deterministic: no random draw). Per token, row i has its own scale
s_i = max_j |t_ij| / qmax; per tensor every row has s = max_ij |t_ij| / qmax. The statistic
compares each token's error relative to its own energy,

    rel_i(s) = E_i(s) / ||t_i||^2 = sum_j f_ij (1 - f_ij) / sum_j (t_ij / s)^2,

summed over the tokens with a nonzero row: e_token = sum_i rel_i(s_i), e_tensor = sum_i rel_i(s).
A layer is per-token iff sqrt(e_token) < ratio * sqrt(e_tensor).

Why relative per token and not the paper's absolute ||g - Q(g)||: one outlier token x1e4 makes
the absolute error of both choices that token's error, so the absolute rule picks per-tensor and
leaves every other token with a step 1e4 times its values, i.e. noise without signal. The
relative sum weighs every token alike, is unchanged when g_y is scaled (computed from t / s,
whose magnitudes lie in [0, qmax], so it neither overflows nor underflows in float64 wherever
g_y itself is finite), and on gradients whose tokens have similar magnitudes it ranks the two
choices as the absolute rule does (every rel_i then is E_i / ||t||^2 times the same constant).

A pass with a non-finite value (an AMP overflow step) contributes nothing (count 0); so does an
all-zero g_y. The statistic is (e_token, e_tensor, tokens counted), summed over passes and
data-parallel ranks before the decision.
"""

from __future__ import annotations

import torch

from .quant import qmax
from .transforms import hq_transform

TOKEN, TENSOR = 1, 0


# Rows per chunk: the statistic is a sum over rows, so a wide g_y (an LM head's vocabulary) is
# measured a slice at a time, never as a float32 copy of the whole transform.
_CHUNK_ELEMENTS = 1 << 24


def _rel_error(v: torch.Tensor) -> torch.Tensor:
    """Per row: sum f (1 - f) / sum v^2 for v = t / s (float32, summed in float64), rows of v
    not all zero."""
    f = v - torch.floor(v)
    return (f * (1 - f)).sum(1, dtype=torch.float64) / v.square().sum(1, dtype=torch.float64)


def statistics(gy2d: torch.Tensor, bits: int) -> torch.Tensor:
    """(e_token, e_tensor, tokens counted) of one backward pass as float64 on gy2d's device."""
    with torch.no_grad():
        rows = max(1, _CHUNK_ELEMENTS // max(1, gy2d.shape[1]))
        chunks = gy2d.split(rows) if gy2d.shape[0] else ()
        amax = [hq_transform(c).abs().amax(1) for c in chunks]
        amax = torch.cat(amax) if amax else gy2d.new_zeros(0, dtype=torch.float32)
        zero = torch.zeros(3, dtype=torch.float64, device=gy2d.device)
        if not bool(torch.isfinite(amax).all()):
            return zero
        live = amax > 0
        n = int(live.sum())
        if n == 0:
            return zero
        m = float(qmax(bits))
        top = amax.max()
        e_tok = e_ten = zero[0]
        for k, c in enumerate(chunks):
            keep = live[k * rows:k * rows + c.shape[0]]
            t = hq_transform(c)[keep]
            a = amax[k * rows:k * rows + c.shape[0]][keep]
            e_tok = e_tok + _rel_error(t * (m / a)[:, None]).sum()
            e_ten = e_ten + _rel_error(t * (m / top)).sum()
        return torch.stack([e_tok, e_ten, zero[0] + n])


def choose(stats: torch.Tensor, ratio: float) -> int:
    """TOKEN iff sqrt(e_token) < ratio * sqrt(e_tensor), from summed statistics (count > 0)."""
    e_tok, e_ten = float(stats[0]), float(stats[1])
    return TOKEN if e_tok ** 0.5 < ratio * e_ten ** 0.5 else TENSOR
