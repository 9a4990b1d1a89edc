"""Quantizer definitions shared by every backend: levels, scales, rounding, the random stream.

Exact math (b = bits, qmax = 2^(b-1) - 1, symmetric levels -qmax..qmax, no -2^(b-1) code):

    amax  = max |x| over the scale group (a row, a column, or the whole tensor)
    scale = amax / qmax, or 1 where amax == 0 (an all-zero group quantizes to exact zeros)
    v     = x / scale
    q     = clamp(floor(v + u), -qmax, qmax)   stochastic, u ~ U[0, 1) from ``uniform``
          = clamp(round_half_even(v), ...)      nearest
    x_hat = q * scale

Stochastic rounding is unbiased: E[floor(v + u)] = v for u uniform on [0, 1). Our u takes the
2^24 values k / 2^24, which biases E[q] by less than 2^-24 of a step.

Non-finite input: a group that holds a NaN or Inf gets a non-finite scale (amax propagates it),
its q is stored as 0, and every product with that scale is non-finite. Integer storage cannot hold
NaN; the scale carries it, so an AMP GradScaler still sees the overflow.

Random numbers u come from one of two streams, both a function of (seed, element index) only:

* "default" (the reference's): on CPU, numpy PCG64 float32 seeded from ``seed`` (two halves from
  SeedSequence([seed, 0]) and ([seed, 1]) for large tensors, drawn in parallel); on GPU,
  torch.rand from a torch.Generator seeded with ``seed``. Row-major order.
* "hash" (what the fast kernels compute; the reference uses it inside ``hash_rng()`` or with
  HOT_RNG=hash, so tests can compare both backends bit for bit): a counter-based hash,

    key     = mix32(seed XOR 0x9E3779B9)
    bits32  = mix32((index mod 2^32) XOR key)
    u       = (bits32 >> 8) / 2^24

where ``index`` is the row-major position of the element in the quantized output tensor, and
mix32 is the "lowbias32" integer finalizer (xor-shift 16, * 0x7FEB352D, xor-shift 15,
* 0x846CA68B, xor-shift 16, all modulo 2^32).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os

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


def derive_seed(*parts: int) -> int:
    """A 31-bit seed from several integers (layer id, step, operand), mixed so nearby inputs differ."""
    h = 0x2545F491
    for p in parts:
        h = mix32(h ^ mix32(int(p) & M32))
    return h & 0x7FFFFFFF


_RNG = {"mode": os.environ.get("HOT_RNG", "default")}


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


_POOL: dict = {}
_SPLIT_MIN = 1 << 18  # below this, one thread: the hand-off costs more than it saves


def _cpu_uniform(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The CPU default stream: numpy PCG64 float32 (24-bit, like torch.rand), in two halves drawn
    in parallel from SeedSequence([seed, 0]) and ([seed, 1]) for large tensors.

    Why not torch.rand: it is single-threaded and measured 2.6x slower here, and random numbers
    are the largest cost of the reference's backward on a CPU (the demo's time budget)."""
    n = math.prod(shape)
    out = np.empty(n, dtype=np.float32)
    threads = min(2, torch.get_num_threads())
    if n < _SPLIT_MIN or threads < 2:
        np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0]))).random(
            dtype=np.float32, out=out)
    else:
        if "pool" not in _POOL:
            _POOL["pool"] = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="hot-rng")
        half = n // 2
        parts = ((0, out[:half]), (1, out[half:]))
        futures = [
            _POOL["pool"].submit(
                np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, i]))).random,
                dtype=np.float32, out=part)
            for i, part in parts
        ]
        for f in futures:
            f.result()
    return torch.from_numpy(out).reshape(shape)


def hash_uniform(seed: int, shape: tuple[int, ...], device=None) -> torch.Tensor:
    """The hash stream: u for the element at row-major index i is mix32(i ^ key(seed)) >> 8 / 2^24."""
    n = 1
    for s in shape:
        n *= s
    idx = torch.arange(n, device=device, dtype=torch.int64) & M32
    bits = mix32_tensor(idx ^ seed_key(seed))
    return ((bits >> 8).to(torch.float32) * (1.0 / (1 << 24))).reshape(shape)


def absmax_scale(x: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
    """scale = amax / qmax over rows ('row' -> (R,1)), columns ('col' -> (1,C)) or all ('tensor' -> (1,1)).

    NaN/Inf propagate into the scale; all-zero groups get scale 1.
    """
    # aminmax reads x once and allocates nothing of x's size (abs() would); NaN propagates.
    if mode == "row":
        lo, hi = torch.aminmax(x, dim=1, keepdim=True)
    elif mode == "col":
        lo, hi = torch.aminmax(x, dim=0, keepdim=True)
    elif mode == "tensor":
        lo, hi = torch.aminmax(x)
        lo, hi = lo.reshape(1, 1), hi.reshape(1, 1)
    else:
        raise ValueError(f"scale mode {mode!r}")
    amax = torch.maximum(-lo, hi)
    amax = amax.to(torch.float32)
    scale = amax / qmax(bits)
    return torch.where(amax == 0, torch.ones_like(scale), scale)


def round_to_levels(
    v: torch.Tensor, bits: int, stochastic: bool, seed: int
) -> torch.Tensor:
    """Round v (already divided by its scale) to the integer levels; returns int8.

    Non-finite v is stored as 0 (its scale is non-finite and carries the NaN/Inf).
    """
    m = qmax(bits)
    if stochastic:
        q = uniform(seed, tuple(v.shape), device=v.device)
        q.add_(v).floor_()
    else:
        q = torch.round(v)
    # clamp maps +-Inf to +-qmax and keeps NaN; nan_to_num_ then stores NaN as 0. (In-place: this
    # runs on every gradient element, and the reference's CPU step time is the demo's budget.)
    q.clamp_(-m, m).nan_to_num_(0.0)
    return q.to(torch.int8)


def quantize(
    x: torch.Tensor, bits: int, mode: str, stochastic: bool, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, scale fp32) with x ~= q * scale; see the module docstring for the exact math.

    Equal to ``round_to_levels(x / scale, ...)``, computed in fewer passes over x (this runs on
    every gradient element; the reference's CPU step time is the demo's budget).
    """
    x = x.to(torch.float32)
    scale = absmax_scale(x, bits, mode)
    if not stochastic:
        return round_to_levels(x / scale, bits, False, seed), scale
    m = qmax(bits)
    q = uniform(seed, tuple(x.shape), device=x.device)
    q.addcdiv_(x, scale).floor_().clamp_(-m, m)  # u + x / scale, rounded as two float32 ops
    if not bool(torch.isfinite(scale).all()):
        q.nan_to_num_(0.0)  # codes of non-finite groups are stored as 0; the scale carries NaN/Inf
    return q.to(torch.int8), scale


def expected_sr_error(x: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
    """E ||x - SR(x)||^2 under stochastic rounding: sum scale^2 * f (1 - f), f = frac(x / scale).

    Deterministic (no random draw), which is why LQS uses it rather than one noisy sample.
    """
    x = x.to(torch.float32)
    scale = absmax_scale(x, bits, mode)
    v = x / scale
    f = v - torch.floor(v)
    return (scale.expand_as(v) ** 2 * f * (1 - f)).sum()
