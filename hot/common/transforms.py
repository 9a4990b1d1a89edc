"""The two block transforms of HOT applied to a 2-D tensor, in plain PyTorch.

Part of the specification (backend-independent): the reference backend quantizes their output,
and LQS measures the transformed g_y with them on any backend.

    hq_transform(x (R, C))                  = pad(x) @ (I (x) H16)        (R, C16)
    hla_transform(x (L, C), rank, selection) = ((I (x) T_r) pad(x))^T      (C, L16 / 16 * rank)
    drawn_transform(x (L, C), rank, seed)     = (((I (x) T_r) D pad(x))^T, the column absmax of
                                                 (I (x) F) D pad(x))

in float32 (float64 stays float64); H16 = hadamard16(), T_r = hla_matrix(rank, selection)
(hot.common.walsh); pad = zero columns / rows up to a multiple of 16. For the drawn selection
"stratified", D is the diagonal of each block's token signs draw_signs(block_draws(seed, .))
and F = full_matrix(rank) the 16 weighted rows whose absmax scales the codes.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .config import BLOCK, DRAWN_SELECTIONS
from .ops import pad_to
from .quant import block_draws
from .walsh import draw_signs, full_matrix, hadamard16, hla_matrix, hla_rows


# The matrices are cached on the CPU only and copied to the data's device per call: a device
# copy cached on first use could be made while a CUDA graph's private memory pool is active
# (LQS calibrates during torch.compile's warm-up), which the graph then finds alive in its pool.
@functools.lru_cache(maxsize=None)
def _hadamard_cpu(dtype: torch.dtype) -> torch.Tensor:
    return hadamard16().to(dtype)


@functools.lru_cache(maxsize=None)
def _hla_cpu(rank: int, selection: str, dtype: torch.dtype) -> torch.Tensor:
    return hla_matrix(rank, selection).to(dtype)


def _hadamard(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return _hadamard_cpu(dtype).to(device)


def _hla(rank: int, selection: str, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return _hla_cpu(rank, selection, dtype).to(device)


@functools.lru_cache(maxsize=None)
def _full_cpu(rank: int, dtype: torch.dtype) -> torch.Tensor:
    return full_matrix(rank).to(dtype)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def hq_transform(x: torch.Tensor) -> torch.Tensor:
    """pad(x) @ (I (x) H16) along the last dimension of a 2-D x, in float32 (float64 stays)."""
    dt = compute_dtype(x)
    r, c = x.shape
    c16 = pad_to(c)
    xp = x.to(dt)
    if c16 != c:
        xp = F.pad(xp, (0, c16 - c))
    # One 2-D GEMM over all blocks of 16. For a transposed input (W^T) the reshape copies it
    # once; the batched product on the strided view ran one small GEMM per row on CPU.
    return (xp.reshape(-1, BLOCK) @ _hadamard(x.device, dt)).reshape(r, c16)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """pad(x) as (L16 / 16, 16, C) in the compute dtype (a view where no cast or pad is needed)."""
    length, c = x.shape
    l16 = pad_to(length)
    xp = x.to(compute_dtype(x))
    if l16 != length:
        xp = F.pad(xp, (0, 0, 0, l16 - length))
    return xp.reshape(l16 // BLOCK, BLOCK, c)


def _columns(coef: torch.Tensor) -> torch.Tensor:
    """(nb, k, C) coefficients -> (C, nb * k): column c's codes of block j at j * k + t."""
    return coef.permute(2, 0, 1).reshape(coef.shape[2], -1)


def hla_transform(x: torch.Tensor, rank: int, selection: str, draw: "int | None" = None
                  ) -> torch.Tensor:
    """((I (x) T_r) pad(x))^T for a 2-D x (L, C): shape (C, L16 / 16 * rank); a drawn
    selection's (``draw``: its int seed) is drawn_transform's first output."""
    if selection in DRAWN_SELECTIONS:
        return drawn_transform(x, rank, draw)[0]
    xb = _blocks(x)
    # T_r applied to each block of 16 rows as one broadcast batched product on the contiguous
    # (nb, 16, C) view: no copy of the input (a transposed view made CPU bmm ~500x slower).
    return _columns(torch.matmul(_hla(rank, selection, x.device, xb.dtype), xb))


def drawn_transform(x: torch.Tensor, rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HLA's "stratified" selection with draw seed ``seed`` for a 2-D x (L, C): (the kept
    coefficients (C, L16 / 16 * rank), each column's absmax over every weighted coefficient
    (C,)): each block's rows times its token signs, then the 16 weighted Walsh rows, of which
    the kept ones are a subset (hot.common.walsh)."""
    if seed is None:
        raise ValueError("a drawn HLA selection needs its draw seed (HLAArgs.draw)")
    xb = _blocks(x)
    signs = draw_signs(block_draws(int(seed), xb.shape[0], x.device)).to(xb.dtype)
    full = torch.matmul(_full_cpu(rank, xb.dtype).to(x.device), xb * signs[:, :, None])
    kept = full[:, list(hla_rows(rank, "stratified"))]
    # max(-min, max) as quant.absmax: no |full| temporary, NaN propagates
    amax = torch.maximum(-full.amin((0, 1)), full.amax((0, 1)))
    return _columns(kept), amax


def hla_untransform(coef: torch.Tensor, rank: int, selection: str, length: int) -> torch.Tensor:
    """(I (x) T_r)^T coef cropped to ``length`` rows, for coef (L16 / 16 * rank, C): the
    adjoint of hla_transform, so hla_untransform(hla_transform(x).T, ...) = P x with P the
    orthogonal projection onto the kept Walsh rows of every block of 16 rows (LBP-WHT's g_x).
    Fixed selections only."""
    if selection in DRAWN_SELECTIONS:
        raise ValueError(f"hla_untransform: selection {selection!r} is drawn per block; the "
                         f"projection exists for fixed selections only")
    dt = compute_dtype(coef)
    nb, c = coef.shape[0] // rank, coef.shape[1]
    rows = torch.matmul(_hla(rank, selection, coef.device, dt).t(),
                        coef.to(dt).reshape(nb, rank, c))
    return rows.reshape(nb * BLOCK, c)[:length]
