"""Walsh-Hadamard matrices, sequency order, and the HLA row selections.

Conventions (used by every backend):

* ``sylvester(n)``: the +-1 Sylvester-Hadamard matrix, H_1 = [1], H_2n = [[H, H], [H, -H]].
* ``walsh(n)``: the same rows divided by sqrt(n) (orthonormal, symmetric for Sylvester order) and
  sorted by sequency (number of sign changes), so row k has sequency k.
* HQ uses ``hadamard16()`` = sylvester(16) / 4 (orthonormal, symmetric, H H = I) on blocks of 16
  consecutive channels: for a row vector block g, the transformed block is g @ H.
* HLA uses ``hla_matrix(rank, selection)`` = the chosen rows of walsh(16): T_r (r x 16),
  T_r T_r^T = I_r, and T_r^T T_r is the orthogonal projector onto the kept subspace.
"""

from __future__ import annotations

import functools

import torch

from .config import BLOCK, VALID_RANKS, HOTConfigError


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
    if selection == "lp_l1":

        def key(k: int) -> tuple[int, int, int]:
            u, v = lp_l1_grid(k)
            return (u + v, max(u, v), k)

        return tuple(sorted(sorted(range(BLOCK), key=key)[:rank]))
    raise HOTConfigError(f"selection={selection!r} is not one of ('lowpass', 'lp_l1').")


def hla_matrix(rank: int, selection: str = "lowpass") -> torch.Tensor:
    """T_r: the kept rows of walsh(16), shape (rank, 16), float64 CPU, orthonormal rows."""
    return walsh(BLOCK)[list(hla_rows(rank, selection))]


def block_diag(mat: torch.Tensor, blocks: int) -> torch.Tensor:
    """Dense I_blocks (x) mat, for tests and documentation (never used on the hot path)."""
    return torch.block_diag(*([mat] * blocks))
