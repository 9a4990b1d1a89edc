"""Walsh-Hadamard matrices, sequency order, and the HLA row selections.

Conventions (used by every backend):

* ``sylvester(n)``: the +-1 Sylvester-Hadamard matrix, H_1 = [1], H_2n = [[H, H], [H, -H]].
* ``walsh(n)``: the same rows divided by sqrt(n) (orthonormal, symmetric for Sylvester order) and
  sorted by sequency (number of sign changes), so row k has sequency k.
* HQ uses ``hadamard16()`` = sylvester(16) / 4 (orthonormal, symmetric, H H = I) on blocks of 16
  consecutive channels: for a row vector block g, the transformed block is g @ H.
* HLA uses ``hla_matrix(rank, selection)`` = the chosen rows of walsh(16): T_r (r x 16),
  T_r T_r^T = I_r, and T_r^T T_r is the orthogonal projector onto the kept subspace (the fixed
  selections "lowpass" and "lp_l1": a biased estimator of g_W).
* The drawn selection "stratified" (an unbiased estimator, docs/algorithm.md section 4b) keeps
  the rows ``hla_rows(rank, "stratified")`` of walsh(16), each times sqrt(1 / p) with p its
  inclusion probability (``hla_weights``), after the block's 16 token rows are multiplied by
  the signs ``draw_signs(m)`` of a drawn m in {0, 4, 8, 12}. Those signs turn Sylvester row n
  into row n XOR m, which moves each row only inside its sequency band (0-3, 4-7, 8-11,
  12-15), uniformly over the band's 4 rows: so band b's kept rows are a uniform draw of
  ``STRATA[rank][b]`` of its 4 rows, p = count / 4, and E[T^T T] = I.
"""

from __future__ import annotations

import functools

import torch

from .config import BLOCK, DRAWN_SELECTIONS, STRATA, VALID_RANKS, HOTConfigError


@functools.lru_cache(maxsize=None)
def _sylvester_cpu(n: int) -> torch.Tensor:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def sylvester(n: int) -> torch.Tensor:
    """+-1 Sylvester-Hadamard matrix of size n (float64, CPU): H H^T = n I."""
    return _sylvester_cpu(n).clone()


def sequency(rows: torch.Tensor) -> torch.Tensor:
    """Number of sign changes along each row."""
    s = torch.sign(rows)
    return (s[:, 1:] != s[:, :-1]).sum(1)


@functools.lru_cache(maxsize=None)
def _walsh_cpu(n: int) -> torch.Tensor:
    h = _sylvester_cpu(n)
    order = torch.argsort(sequency(h), stable=True)
    return h[order] / n**0.5


def walsh(n: int = BLOCK) -> torch.Tensor:
    """Orthonormal Walsh basis in sequency order (float64, CPU): row k has k sign changes."""
    return _walsh_cpu(n).clone()


def hadamard16() -> torch.Tensor:
    """The HQ transform: sylvester(16) / 4, orthonormal and symmetric (float64, CPU)."""
    return sylvester(BLOCK) / 4.0


def lp_l1_grid(k: int, s: int = 4) -> tuple[int, int]:
    """Sequency k of the s^2-point Walsh basis as a 2-D index (u, v) on an s x s grid.

    k = s*u + (v if u is even else s-1-v): the boustrophedon reading used by LBP-WHT, under
    which walsh(s^2)[k] == kron(walsh(s)[v], walsh(s)[u]) (u, the coarse digit of k, is the
    sequency of the inner factor). LP_L1's ranking is symmetric in (u, v), so the kept set does
    not depend on which factor is called u.
    """
    u, rem = divmod(k, s)
    v = rem if u % 2 == 0 else s - 1 - rem
    return u, v


@functools.lru_cache(maxsize=None)
def hla_rows(rank: int, selection: str = "lowpass") -> tuple[int, ...]:
    """Sequency indices of the Walsh rows HLA keeps per block of 16, in increasing order.

    lowpass: (0, 1, ..., rank-1), the 1-D low-pass.
    lp_l1: rank by (u+v, max(u, v), k) on the 4x4 grid of ``lp_l1_grid``; keep the first ``rank``.
        For rank 8 this is {0, 1, 2, 5, 6, 7, 8, 9}.
    """
    if rank not in VALID_RANKS:
        raise HOTConfigError(f"rank={rank!r} is not supported: use one of {VALID_RANKS}.")
    if selection == "lowpass":
        return tuple(range(rank))
    if selection == "stratified":
        return tuple(4 * b + i for b, c in enumerate(_strata(rank)) for i in range(c))
    if selection == "lp_l1":

        def key(k: int) -> tuple[int, int, int]:
            u, v = lp_l1_grid(k)
            return (u + v, max(u, v), k)

        return tuple(sorted(sorted(range(BLOCK), key=key)[:rank]))
    raise HOTConfigError(f"selection={selection!r} is not one of ('lowpass', 'lp_l1', "
                         f"'stratified').")


def _strata(rank: int) -> tuple[int, ...]:
    if rank not in STRATA:
        raise HOTConfigError(f"HLAConfig(selection='stratified') supports rank {sorted(STRATA)}, "
                             f"not {rank!r}: it keeps at least one row of each of the four "
                             f"sequency bands; use rank 4 or 8, or a fixed selection.")
    return STRATA[rank]


@functools.lru_cache(maxsize=None)
def hla_weights(rank: int, selection: str = "lowpass") -> tuple[float, ...]:
    """The weight 1 / p of each kept row (hla_rows' order): 1 for the fixed selections; for
    "stratified", 4 / (rows kept of the row's band)."""
    if selection not in DRAWN_SELECTIONS:
        return (1.0,) * len(hla_rows(rank, selection))
    return tuple(4.0 / c for c in _strata(rank) for _ in range(c))


def band_weights(rank: int) -> tuple[float, ...]:
    """"stratified": the weight 1 / p of each of the 16 sequencies (that of its band)."""
    return tuple(4.0 / c for c in _strata(rank) for _ in range(4))


def hla_matrix(rank: int, selection: str = "lowpass") -> torch.Tensor:
    """T_r: the kept rows of walsh(16) times sqrt(hla_weights), shape (rank, 16), float64 CPU
    (orthonormal rows for the fixed selections)."""
    w = torch.tensor(hla_weights(rank, selection), dtype=torch.float64).sqrt()
    return walsh(BLOCK)[list(hla_rows(rank, selection))] * w[:, None]


def full_matrix(rank: int) -> torch.Tensor:
    """"stratified": every row of walsh(16) times sqrt of its band's weight (16 x 16, float64):
    the kept rows of any draw are rows of it, and a draw only permutes rows inside a band, so
    the absmax over all 16 rows is the same for every draw (the scale of the codes)."""
    w = torch.tensor(band_weights(rank), dtype=torch.float64).sqrt()
    return walsh(BLOCK) * w[:, None]


def draw_signs(m: torch.Tensor) -> torch.Tensor:
    """The token signs of draws m (any shape, values in {0, 4, 8, 12}): (..., 16) float32 with
    sign[..., i] = (-1)^popcount(m & i); sylvester(16) @ diag(sign) has row n XOR m at row n.
    They are constant on each quarter of the block (m has bits 2 and 3 only)."""
    i = torch.arange(BLOCK, device=m.device)
    b = m.unsqueeze(-1) & i
    parity = ((b >> 2) ^ (b >> 3)) & 1
    return (1 - 2 * parity).to(torch.float32)


def block_diag(mat: torch.Tensor, blocks: int) -> torch.Tensor:
    """Dense I_blocks (x) mat, for tests and documentation (never used on the hot path)."""
    return torch.block_diag(*([mat] * blocks))
