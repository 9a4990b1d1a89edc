"""Quantizer definitions shared by every backend: levels, scales, rounding, the random stream.

Exact math (b = bits, qmax = 2^(b-1) - 1, symmetric levels -qmax..qmax, no -2^(b-1) code; every
operation below is one float32 operation, rounded to nearest even, none fused with another):

    amax  = max |x| over the scale group (a row, a column, or the whole tensor)
    scale = amax / qmax, or 1 where amax == 0 (an all-zero group quantizes to exact zeros)
    r     = 1 / scale, correctly rounded, once per group; 0 where that overflows to +Inf
    v     = x * r
    q     = clamp(floor(v + u), -qmax, qmax)   stochastic, u in [0, 1) from ``uniform``; v + u
                                                is rounded to float32 before the floor (no FMA)
          = clamp(round_half_even(v), ...)      nearest
    x_hat = q * scale

Why a reciprocal: the GPU kernels then pay one multiply per code instead of a correctly rounded
division (about 15% of the quantize kernel's time on an H100, docs/kernels.md); x * r may differ
from x / scale by an ulp, which moves a code only where v lies within an ulp of a rounding
boundary, and the reference computes the same x * r, so the two backends still agree bit for bit.
r overflows only for scale < 2^-128 (amax below ~1e-36, under float32's normal range times qmax):
such a group is flushed, its codes are 0 and its scale is kept, as float32 arithmetic underflows
(a reciprocal of +Inf there would send every nonzero element to +-qmax instead).

Stochastic rounding is unbiased: E[floor(v + u)] = v for u uniform on [0, 1). Our u takes the
2^16 midpoints (k + 1/2) / 2^16 on both the hash stream and the default CPU stream, so
P(round up) = round(2^16 f) / 2^16 for f = frac(v): the bias of E[q] - v is at most 2^-17 of a
step in either direction. On the GPU default stream (torch.rand, k / 2^24) it lies in
[-2^-24, 0].

Non-finite input: a group that holds a NaN or Inf gets a non-finite scale (amax propagates it), so
r is 0 (scale Inf) or NaN, v is 0 or NaN, and its q is stored as 0; every product with that scale
is non-finite. Integer storage cannot hold NaN; the scale carries it, so an AMP GradScaler still
sees the overflow.

Random numbers u come from one of two streams, both a function of (seed, element index) only:

* "default" (the reference's): on CPU, u = (k + 1/2) / 2^16 for the 16-bit words k of numpy
  PCG64 raw 64-bit outputs (four per output, the least significant first on little-endian
  hosts), the generator seeded from SeedSequence([seed]). On GPU, torch.rand from a
  torch.Generator seeded with ``seed`` (24-bit). Row-major order.
* "hash" (what the fast kernels compute; the reference uses it inside ``hash_rng()``, so tests
  can compare both backends bit for bit): a counter-based hash giving
  two 16-bit thresholds per 32-bit hash, for the element at row-major index i,

    key     = mix32(seed XOR 0x9E3779B9)
    w       = mix32(((i >> 1) mod 2^32) XOR key)          one hash per pair (2m, 2m + 1)
    k       = (w >> (16 * (i & 1))) & 0xFFFF            low half for even i, high half for odd
    u       = (k + 1/2) / 2^16

where ``i`` is the row-major position of the element in the quantized output tensor, and mix32
is the "lowbias32" integer finalizer (xor-shift 16, * 0x7FEB352D, xor-shift 15, * 0x846CA68B,
xor-shift 16, all modulo 2^32). The two codes of a pair use disjoint bits of one hash, so they
are as independent as two hashes would be (lowbias32's halves are close to independent; the
tests check uniformity and the pair correlation).
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple, Optional

import numpy as np

import torch

M32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
MIX_C1 = 0x7FEB352D
MIX_C2 = 0x846CA68B


def qmax(bits: int) -> int:
    return (1 << (bits - 1)) - 1


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # x < 2^32 in int64; split c so no product overflows int64.
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & M32


def mix32_tensor(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on an int64 tensor holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_C1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_C2)
    x = x ^ (x >> 16)
    return x


def mix32(x: int) -> int:
    """lowbias32 on a Python int (the same function as ``mix32_tensor``)."""
    x &= M32
    x ^= x >> 16
    x = (x * MIX_C1) & M32
    x ^= x >> 15
    x = (x * MIX_C2) & M32
    x ^= x >> 16
    return x


def seed_key(seed: int) -> int:
    return mix32((seed & M32) ^ GOLDEN)


_SEED_H0 = 0x2545F491


# mix32 of the small integers that seed derivations use as salts and operand numbers: hashed once
# (the host time of a layer's backward on the GPU machines is dominated by such Python work).
_MIX_SMALL = tuple(mix32(i) for i in range(64))


def seed_prefix(*parts: int, h: int = _SEED_H0) -> int:
    """The running hash of ``derive_seed`` after ``parts``: derive_seed(*a, *b) ==
    derive_seed_from(seed_prefix(*a), *b), so a caller can hash a fixed prefix once."""
    for p in parts:
        p = int(p) & M32
        h = mix32(h ^ (_MIX_SMALL[p] if p < 64 else mix32(p)))
    return h


def derive_seed_from(h: int, *parts: int) -> int:
    return seed_prefix(*parts, h=h) & 0x7FFFFFFF


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from several integers (layer id, step, operand), mixed so nearby inputs differ."""
    return seed_prefix(*parts) & 0x7FFFFFFF


def step_seed(base: int, step: int) -> int:
    """The 31-bit seed of step ``step`` of a counter whose constant part is ``base``:
    mix32(base XOR mix32(step mod 2^32)) & 0x7FFFFFFF. The fast kernels form the same from the
    counter in device memory (so a CUDA graph replay rounds with the step of its own call)."""
    return mix32((base & M32) ^ mix32(step & M32)) & 0x7FFFFFFF


class StepSeed(NamedTuple):
    """A seed that follows a step counter: ``step_seed(base, step)``. The fast kernels read the
    step from ``counter`` (an int64 tensor of one element on the data's device); the reference
    uses ``step`` (the host's copy of the same count), or reads the counter when that is None.
    Both give the same seed as long as the counter holds ``step`` when the kernels run."""

    base: int
    counter: Optional[torch.Tensor]
    step: Optional[int]


def seed_value(seed: "int | StepSeed") -> int:
    """The int seed of an int or a StepSeed (reading the counter if the step is not given)."""
    if isinstance(seed, StepSeed):
        return step_seed(seed.base, int(seed.step if seed.step is not None else seed.counter))
    return int(seed)


def block_draws(seed: int, nblocks: int, device=None) -> torch.Tensor:
    """HLA's drawn selection (HLAConfig(selection="stratified")): the draw m in {0, 4, 8, 12}
    of each block j = 0 .. nblocks-1 of 16 rows, int64 on ``device``:
        m_j = 4 * (mix32(j XOR seed_key(seed)) & 3)
    a function of (seed, j) only, so x's codes in forward and g_y's in backward draw the same
    rows from the same seed (hot.common.walsh.draw_signs says what m does)."""
    j = torch.arange(nblocks, dtype=torch.int64, device=device)
    return (mix32_tensor(j ^ seed_key(seed)) & 3) << 2


_RNG = {"mode": "default"}


@contextlib.contextmanager
def hash_rng():
    """Inside this block the reference draws its stochastic-rounding numbers from the hash
    stream that the fast kernels use (test mode for bit-exact differential tests)."""
    old = _RNG["mode"]
    _RNG["mode"] = "hash"
    try:
        yield
    finally:
        _RNG["mode"] = old


def rng_mode() -> str:
    return _RNG["mode"]


def uniform(seed: int, shape: tuple[int, ...], device=None) -> torch.Tensor:
    """u in [0, 1) for every element of a tensor of ``shape`` (float32), from the current stream."""
    if _RNG["mode"] == "hash":
        return hash_uniform(seed, shape, device)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cpu":
        return _cpu_uniform(int(seed), shape)
    g = torch.Generator(device=dev)
    g.manual_seed(int(seed))
    return torch.rand(shape, generator=g, device=dev, dtype=torch.float32)


def _cpu_uniform(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The CPU default stream (see the module docstring): 16-bit u from PCG64's raw words.

    Why not torch.rand or numpy's float32 ``random``: both make one generator call per number,
    while one raw 64-bit output gives four 16-bit thresholds; in the demo's training step this
    cut the time spent on random numbers from about 135 to 52-67 ms (torch.rand is slower
    still), and random numbers are the largest cost of the reference's backward on a CPU. The
    price is the 2^-17 bias bound above instead of 2^-24 (docs/algorithm.md, differences
    table). One thread: drawing halves in parallel measured slower inside a training step on
    two cores."""
    n = math.prod(shape)
    raw = np.random.PCG64(np.random.SeedSequence([seed])).random_raw((n + 3) // 4)
    u = torch.from_numpy(raw.view(np.uint16)[:n]).to(torch.float32)
    return u.mul_(2.0**-16).add_(2.0**-17).reshape(shape)  # exact: 17 significant bits


def hash_uniform(seed: int, shape: tuple[int, ...], device=None) -> torch.Tensor:
    """The hash stream (module docstring): u for the element at row-major index i is
    (k + 1/2) / 2^16, k the half of w = mix32(((i >> 1) mod 2^32) ^ key(seed)) that i & 1 picks."""
    n = math.prod(shape)
    pairs = torch.arange((n + 1) // 2, device=device, dtype=torch.int64) & M32
    w = mix32_tensor(pairs ^ seed_key(seed))
    k = torch.stack([w & 0xFFFF, w >> 16], dim=1).reshape(-1)[:n]  # even i: low half, odd: high
    # k * 2^-16 + 2^-17 is exact in float32 (17 significant bits).
    return k.to(torch.float32).mul_(2.0**-16).add_(2.0**-17).reshape(shape)


def absmax(x: torch.Tensor, mode: str) -> torch.Tensor:
    """amax = max |x| in float32 over rows ('row' -> (R,1)), columns ('col' -> (1,C)) or all
    ('tensor' -> (1,1)); NaN/Inf propagate."""
    # max(-min, max) allocates nothing of x's size (abs() would); NaN propagates through both.
    # Separate amax and amin, not aminmax: CPU aminmax along a dimension measured 6-9x slower.
    if mode == "row":
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
    elif mode == "col":
        lo, hi = x.amin(0, keepdim=True), x.amax(0, keepdim=True)
    elif mode == "tensor":
        lo, hi = x.amin().reshape(1, 1), x.amax().reshape(1, 1)
    else:
        raise ValueError(f"scale mode {mode!r}")
    return torch.maximum(-lo, hi).to(torch.float32)


def absmax_scale(x: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
    """scale = amax / qmax over rows ('row' -> (R,1)), columns ('col' -> (1,C)) or all ('tensor' -> (1,1)).

    NaN/Inf propagate into the scale; all-zero groups get scale 1.
    """
    return amax_scale(absmax(x, mode), bits)


def amax_scale(amax: torch.Tensor, bits: int) -> torch.Tensor:
    """scale = amax / qmax, 1 where amax == 0 (NaN/Inf propagate): absmax_scale from its amax."""
    scale = amax / qmax(bits)
    return torch.where(amax == 0, torch.ones_like(scale), scale)


# Delayed scale (HLAConfig.amax = "delayed"): a group's candidate is c = DELAYED_MARGIN * h, h the
# absmax the same group had in the previous pass. Its scale is c / qmax wherever this pass's own
# absmax a satisfies c / DELAYED_RANGE <= a <= c, i.e. h / 4 <= a <= 4 h (no code clips, at least
# 1/16 of the levels stay in use, 1/4 where a = h); elsewhere (h = 0 on the first pass, h not
# finite, a outside the window, a NaN) it is a's, as absmax_scale gives it. Why so wide: a group
# outside the window costs a second read of its whole tile, and the groups that leave it are
# scattered. Training TinyViT on Fashion-MNIST, log2(a / h) had 3.6% of groups beyond +-1 (a
# window of [h / 2, 2 h], and about 97% of 64-column tiles re-read), 0.08% beyond +-2 and 0.002%
# beyond +-3 (docs/performance.md).
DELAYED_MARGIN = 4.0
DELAYED_RANGE = 16.0


def delayed_keep(amax: torch.Tensor, hist: torch.Tensor) -> torch.Tensor:
    """Where the candidate DELAYED_MARGIN * hist is the scale's numerator (bool, amax's shape).
    Every product is by a power of two and so exact: a kernel that evaluates the same
    comparisons keeps the same groups."""
    c = hist.to(torch.float32) * DELAYED_MARGIN
    a = amax.to(torch.float32)
    return (hist > 0) & torch.isfinite(c) & (a <= c) & (a * DELAYED_RANGE >= c)


def delayed_numerator(amax: torch.Tensor, hist: torch.Tensor) -> torch.Tensor:
    """What takes the absmax's place in the scale: DELAYED_MARGIN * hist where delayed_keep,
    else amax (float32)."""
    a = amax.to(torch.float32)
    return torch.where(delayed_keep(a, hist), hist.to(torch.float32) * DELAYED_MARGIN, a)


def delayed_scale(amax: torch.Tensor, hist: torch.Tensor, bits: int) -> torch.Tensor:
    """The groups' scales from this pass's absmax ``amax`` and the previous pass's ``hist``
    (same shape): delayed_numerator / qmax, i.e. DELAYED_MARGIN * hist / qmax where
    delayed_keep, else amax / qmax (1 where amax == 0, non-finite where amax is)."""
    num = delayed_numerator(amax, hist)
    return torch.where(num == 0, torch.ones_like(num), num / qmax(bits))


def reciprocal(scale: torch.Tensor) -> torch.Tensor:
    """r = 1 / scale in float32, correctly rounded (IEEE division), and 0 where that overflows to
    +Inf (scale < 2^-128: the group is flushed to zero codes, module docstring). r = 0 for an
    Inf scale and NaN for a NaN scale, so such groups' codes come out 0 or NaN -> 0."""
    r = torch.reciprocal(scale.to(torch.float32))
    return r.masked_fill_(r == math.inf, 0.0)


def round_to_levels(
    v: torch.Tensor, bits: int, stochastic: bool, seed: int
) -> torch.Tensor:
    """Round v (already multiplied by its reciprocal scale) to the integer levels; returns int8:
    clamp(floor(fl32(v + u)), +-qmax) or clamp(round_half_even(v), +-qmax).

    Non-finite v is stored as 0 (its scale is non-finite and carries the NaN/Inf).
    """
    m = qmax(bits)
    if stochastic:
        q = uniform(seed, tuple(v.shape), device=v.device)
        q.add_(v).floor_()  # v + u, one float32 addition, then the floor
    else:
        q = torch.round(v)
    # clamp maps +-Inf to +-qmax and keeps NaN; nan_to_num_ then stores NaN as 0. (In-place: this
    # runs on every gradient element, and the reference's CPU step time is the demo's budget.)
    q.clamp_(-m, m).nan_to_num_(0.0)
    return q.to(torch.int8)


def may_be_nonfinite(scale: torch.Tensor) -> bool:
    """Whether codes quantized with ``scale`` must be cleared where they are not finite: where
    some scale is NaN/Inf. Off the CPU always, without looking: codes of finite scales are
    finite, so clearing changes nothing there, and reading the scale on the host would stall
    the GPU queue (and cannot run inside a CUDA graph)."""
    return scale.device.type != "cpu" or not bool(torch.isfinite(scale).all())


def quantize(
    x: torch.Tensor, bits: int, mode: str, stochastic: bool, seed: int,
    scale: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, scale fp32) with x ~= q * scale; see the module docstring for the exact math.
    ``scale``: the groups' scales where they are not x's absmax ones (delayed_scale).

    Equal to ``round_to_levels(x * reciprocal(scale), ...)``, computed in fewer passes over x
    (this runs on every gradient element; the reference's CPU step time is the demo's budget).
    """
    x = x.to(torch.float32)
    if scale is None:
        scale = absmax_scale(x, bits, mode)
    # x * r and then + u as two separately rounded operations: torch.addcmul_ could be
    # contracted into an FMA by the compiler of its vectorized kernel, which is not the spec.
    # Into a contiguous buffer: x may be a transposed view (HLA), and q must be row-major.
    v = torch.mul(x, reciprocal(scale), out=torch.empty(x.shape, dtype=torch.float32,
                                                        device=x.device))
    if not stochastic:
        return round_to_levels(v, bits, False, seed), scale
    m = qmax(bits)
    v.add_(uniform(seed, tuple(x.shape), device=x.device)).floor_().clamp_(-m, m)
    if may_be_nonfinite(scale):
        v.nan_to_num_(0.0)  # codes of non-finite groups are stored as 0; the scale carries NaN/Inf
    return v.to(torch.int8), scale
