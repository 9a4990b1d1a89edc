"""Host side of the fast quantizers: hq_quantize, hla_quantize and the fused g_y pass.

Same function as hot.reference.ops (see hot.common.ops for the math); the stochastic rounding
consumes the hash stream of hot.common.quant, so inside ``quant.hash_rng()`` the reference
reproduces the codes (up to the ~1-ulp transform differences documented in the tests).
bits = 0 and float64 inputs delegate to the reference (no integer kernel is involved).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import torch

from ..common import quant
from ..common.config import BLOCK
from ..common.ops import pad_to
from ..common.walsh import hadamard16, hla_matrix
from ..reference import ops as ref

# Tile of one program: multiples of 16 (whole Hadamard / Walsh blocks in both directions).
# HOT_FAST_QTILE="R,C,warps" overrides it (benchmarks/sweep_gy_pass.py sweeps it on a GPU).
BLOCK_R, BLOCK_C, NUM_WARPS = (int(v) for v in os.environ.get("HOT_FAST_QTILE", "64,64,4").split(","))


@functools.lru_cache(maxsize=None)
def _mats(device: torch.device, rank: int, selection: str):
    h = hadamard16().to(torch.float32)
    t = torch.zeros(BLOCK, BLOCK, dtype=torch.float64)
    t[:, :rank] = hla_matrix(rank, selection).t()
    return h.contiguous().to(device), t.to(torch.float32).contiguous().to(device)


def _key(seed: int) -> int:
    """quant.seed_key as a signed 32-bit pattern (Triton int arguments are int32)."""
    k = quant.seed_key(seed)
    return k - (1 << 32) if k >= (1 << 31) else k


def scale_from_amax(amax: torch.Tensor, bits: int) -> torch.Tensor:
    """quant.absmax_scale after the max: amax / qmax, 1 where amax == 0, NaN/Inf propagate."""
    amax = amax.to(torch.float32)
    s = amax / quant.qmax(bits)
    return torch.where(amax == 0, torch.ones_like(s), s)


def _prec(x: torch.Tensor) -> str:
    # bf16/fp16 values and the +-1/4 matrix entries are exact in tf32; fp32 needs full precision.
    return "tf32" if x.dtype in (torch.bfloat16, torch.float16) else "ieee"


def _check(x: torch.Tensor, what: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"fast {what}: expected a 2-D tensor, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"fast {what}: dtype {x.dtype} is not supported (float32/bfloat16/float16)")


def gy_pass(x: torch.Tensor, hq: Optional[tuple], hla: Optional[tuple]):
    """One pair of launches over x for HQ and/or HLA.

    hq  = (bits, scale_mode, stochastic, seed)                    -> (q (R, C16), scale)
    hla = (rank, selection, bits, scale_mode, stochastic, seed)   -> (q (C, L16/16*rank), scale)
    Returns (hq_q, hq_s, hla_q, hla_s), None for a part not asked for. Both bits must be > 0.
    """
    from .quant_kernels import hot_tile_kernel

    r, c = x.shape
    dev = x.device
    c16, l16 = pad_to(c), pad_to(r)
    grid = (triton_cdiv(l16, BLOCK_R), triton_cdiv(c16, BLOCK_C))
    rank, selection = (hla[0], hla[1]) if hla else (BLOCK, "lowpass")
    h, t = _mats(dev, rank, selection)
    dummy_i8 = torch.empty(1, dtype=torch.int8, device=dev)
    dummy_f = torch.empty(1, dtype=torch.float32, device=dev)
    hq_amax = torch.empty((grid[1], r), dtype=torch.float32, device=dev) if hq else dummy_f
    hla_amax = torch.empty((grid[0], c), dtype=torch.float32, device=dev) if hla else dummy_f
    lr = l16 // BLOCK * rank
    common = dict(BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C, DO_HQ=hq is not None, DO_HLA=hla is not None,
                  HQ_QMAX=quant.qmax(hq[0]) if hq else 1, HQ_STOCH=bool(hq and hq[2]),
                  HLA_QMAX=quant.qmax(hla[2]) if hla else 1, HLA_STOCH=bool(hla and hla[4]),
                  RANK=rank, PREC=_prec(x), num_warps=NUM_WARPS)

    def launch(phase, hq_q, hq_s, hla_q, hla_s):
        hot_tile_kernel[grid](
            x, x.stride(0), x.stride(1), r, c, h, t,
            hq_q, hq_s, hq_amax, c16, hq_s.stride(0) if hq_s.shape[0] > 1 else 0,
            _key(hq[3]) if hq else 0,
            hla_q, hla_s, hla_amax, lr, l16 // BLOCK, hla_s.stride(0) if hla_s.shape[0] > 1 else 0,
            _key(hla[5]) if hla else 0,
            PHASE=phase, **common)

    launch(0, dummy_i8, dummy_f, dummy_i8, dummy_f)
    hq_q = hq_s = hla_q = hla_s = None
    if hq:
        a = hq_amax.amax(0)  # torch.amax propagates NaN
        a = a.reshape(r, 1) if hq[1] == "row" else a.amax().reshape(1, 1)
        hq_s = scale_from_amax(a, hq[0])
        hq_q = torch.empty((r, c16), dtype=torch.int8, device=dev)
    if hla:
        a = hla_amax.amax(0)
        a = a.reshape(c, 1) if hla[3] == "row" else a.amax().reshape(1, 1)
        hla_s = scale_from_amax(a, hla[2])
        hla_q = torch.empty((c, lr), dtype=torch.int8, device=dev)
    launch(1, hq_q if hq else dummy_i8, hq_s if hq else dummy_f,
           hla_q if hla else dummy_i8, hla_s if hla else dummy_f)
    return hq_q, hq_s, hla_q, hla_s


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _tag(q: torch.Tensor, bits: int) -> torch.Tensor:
    # Codes within [-7, 7] may use the packed int4 GEMM on Ampere (hot.fast.gemm).
    from .gemm import tag_small_codes

    return tag_small_codes(q) if bits <= 4 else q


def _delegate(x: torch.Tensor, bits: int) -> bool:
    return bits == 0 or x.dtype == torch.float64 or x.numel() == 0


def hq_quantize(x, bits, scale_mode, stochastic, seed):
    if _delegate(x, bits):
        return ref.hq_quantize(x, bits, scale_mode, stochastic, seed)
    _check(x, "hq_quantize")
    q, s, _, _ = gy_pass(x, (bits, scale_mode, stochastic, seed), None)
    return _tag(q, bits), s


def hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed):
    if _delegate(x, bits):
        return ref.hla_quantize(x, rank, selection, bits, scale_mode, stochastic, seed)
    _check(x, "hla_quantize")
    _, _, q, s = gy_pass(x, None, (rank, selection, bits, scale_mode, stochastic, seed))
    return _tag(q, bits), s


def gy_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed, rank, selection, hla_bits,
                hla_scale_mode, hla_stochastic, hla_seed):
    """The fused g_y pass: (hq_quantize(x, ...), hla_quantize(x, ...)) from one read of each tile."""
    if _delegate(x, hq_bits) or _delegate(x, hla_bits):
        a = hq_quantize(x, hq_bits, hq_scale_mode, hq_stochastic, hq_seed)
        b = hla_quantize(x, rank, selection, hla_bits, hla_scale_mode, hla_stochastic, hla_seed)
        return a[0], a[1], b[0], b[1]
    _check(x, "gy_quantize")
    q1, s1, q2, s2 = gy_pass(x, (hq_bits, hq_scale_mode, hq_stochastic, hq_seed),
                             (rank, selection, hla_bits, hla_scale_mode, hla_stochastic, hla_seed))
    return _tag(q1, hq_bits), s1, _tag(q2, hla_bits), s2
