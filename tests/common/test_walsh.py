"""Walsh/Hadamard tables and HLA row selections (hot.common.walsh) against their definitions.

Everything here is exact +-1/4 or +-1/sqrt(n) arithmetic in float64, so identities are checked
to 1e-12 (a few ulps of values of order 1 after sums of at most 64 terms).
"""

import itertools

import pytest
import torch

from hot.common import walsh
from hot.common.config import BLOCK, VALID_RANKS, HOTConfigError

TOL = 1e-12
SELECTIONS = ("lowpass", "lp_l1")


def _eye(n):
    return torch.eye(n, dtype=torch.float64)


def _sign_changes(row):
    # Written independently of walsh.sequency: count adjacent entries with opposite signs.
    return sum(1 for a, b in zip(row.tolist(), row.tolist()[1:]) if (a > 0) != (b > 0))


def test_hadamard16_orthonormal_symmetric_involution():
    h = walsh.hadamard16()
    assert h.shape == (16, 16)
    # Entries are +-1/4: the Sylvester matrix divided by sqrt(16).
    assert torch.equal(h.abs(), torch.full((16, 16), 0.25, dtype=torch.float64))
    torch.testing.assert_close(h @ h.T, _eye(16), atol=TOL, rtol=0)
    torch.testing.assert_close(h, h.T, atol=0, rtol=0)
    torch.testing.assert_close(h @ h, _eye(16), atol=TOL, rtol=0)


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_sylvester_recursion_and_walsh_orthonormal(n):
    s = walsh.sylvester(n)
    torch.testing.assert_close(s @ s.T, n * _eye(n), atol=TOL, rtol=0)
    if n > 1:
        half = walsh.sylvester(n // 2)
        expect = torch.cat([torch.cat([half, half], 1), torch.cat([half, -half], 1)], 0)
        assert torch.equal(s, expect)
    w = walsh.walsh(n)
    torch.testing.assert_close(w @ w.T, _eye(n), atol=TOL, rtol=0)
    # Same rows as Sylvester up to order: each Walsh row is some scaled Sylvester row.
    match = (w * n**0.5) @ s.T / n  # +1 where rows coincide
    assert torch.equal((match.abs() > 0.5).sum(1), torch.ones(n, dtype=torch.int64))


@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_walsh_row_k_has_sequency_k(n):
    w = walsh.walsh(n)
    assert [_sign_changes(w[k]) for k in range(n)] == list(range(n))
    assert torch.equal(walsh.sequency(w), torch.arange(n))


def test_walsh16_is_kron_of_walsh4_on_the_boustrophedon_grid():
    """walsh(16)[k] is a Kronecker product of two walsh(4) rows indexed by the grid reading
    k = 4u + (v if u even else 3 - v): this is what makes (u, v) a 2-D frequency.

    The factor order is kron(walsh(4)[v], walsh(4)[u]): u, the coarse digit of k, counts the
    sign changes inside each group of 4 (the inner factor). kron(walsh(4)[u], walsh(4)[v]) does
    NOT hold for u != v; LP_L1 is unaffected because its ranking is symmetric in (u, v)."""
    w16, w4 = walsh.walsh(16), walsh.walsh(4)
    seen = set()
    transposed_differs = 0
    for k in range(16):
        u, v = walsh.lp_l1_grid(k)
        # The grid reading from the definition, computed here independently.
        assert k == 4 * u + (v if u % 2 == 0 else 3 - v)
        seen.add((u, v))
        torch.testing.assert_close(w16[k], torch.kron(w4[v], w4[u]), atol=TOL, rtol=0)
        transposed_differs += not torch.allclose(w16[k], torch.kron(w4[u], w4[v]))
        assert _lp_l1_key(k) == (u + v, max(u, v)) == (v + u, max(v, u))
    assert seen == set(itertools.product(range(4), range(4)))
    assert transposed_differs == 12  # every off-diagonal cell of the grid


@pytest.mark.parametrize("rank", VALID_RANKS)
@pytest.mark.parametrize("selection", SELECTIONS)
def test_hla_matrix_rows_orthonormal(rank, selection):
    t = walsh.hla_matrix(rank, selection)
    assert t.shape == (rank, BLOCK)
    torch.testing.assert_close(t @ t.T, _eye(rank), atol=TOL, rtol=0)
    # The kept rows are exactly the Walsh rows named by hla_rows.
    assert torch.equal(t, walsh.walsh(16)[list(walsh.hla_rows(rank, selection))])


@pytest.mark.parametrize("rank", VALID_RANKS)
def test_lowpass_keeps_first_r_sequencies(rank):
    assert walsh.hla_rows(rank, "lowpass") == tuple(range(rank))
    assert torch.equal(walsh.sequency(walsh.hla_matrix(rank, "lowpass")), torch.arange(rank))


def _lp_l1_key(k):
    u, v = divmod(k, 4)
    if u % 2:
        v = 3 - v
    return (u + v, max(u, v))


@pytest.mark.parametrize("rank", VALID_RANKS)
def test_lp_l1_is_a_top_r_set_under_its_ranking(rank):
    """Every kept index ranks no worse than every dropped one under (u+v, max(u,v)); ties at the
    cut (only rank 2 has one: (0,1) vs (1,0)) go to the smaller sequency k."""
    kept = walsh.hla_rows(rank, "lp_l1")
    assert len(kept) == rank and list(kept) == sorted(set(kept))
    dropped = [k for k in range(16) if k not in kept]
    for a in kept:
        for b in dropped:
            assert (_lp_l1_key(a), a) < (_lp_l1_key(b), b), (rank, a, b)


def test_lp_l1_tables_by_hand():
    # Worked from the definition on the 4x4 grid: (0,0)=0 | (0,1)=1, (1,0)=7 | (1,1)=6, (0,2)=2,
    # (2,0)=8 | u+v=3, max 2: (1,2)=5, (2,1)=9 | ...
    assert walsh.hla_rows(1, "lp_l1") == (0,)
    assert walsh.hla_rows(2, "lp_l1") == (0, 1)
    assert walsh.hla_rows(4, "lp_l1") == (0, 1, 6, 7)
    assert walsh.hla_rows(8, "lp_l1") == (0, 1, 2, 5, 6, 7, 8, 9)
    assert walsh.hla_rows(16, "lp_l1") == tuple(range(16))


@pytest.mark.parametrize("rank", VALID_RANKS)
@pytest.mark.parametrize("selection", SELECTIONS)
def test_hla_projector_idempotent_symmetric_rank_r(rank, selection):
    t = walsh.hla_matrix(rank, selection)
    p = t.T @ t
    torch.testing.assert_close(p @ p, p, atol=TOL, rtol=0)
    torch.testing.assert_close(p, p.T, atol=0, rtol=0)
    assert torch.linalg.matrix_rank(p).item() == rank
    torch.testing.assert_close(torch.trace(p), torch.tensor(float(rank), dtype=torch.float64),
                               atol=TOL, rtol=0)
    # It fixes the kept rows and annihilates the dropped ones.
    w = walsh.walsh(16)
    kept = set(walsh.hla_rows(rank, selection))
    for k in range(16):
        expect = w[k] if k in kept else torch.zeros(16, dtype=torch.float64)
        torch.testing.assert_close(p @ w[k], expect, atol=TOL, rtol=0)


@pytest.mark.parametrize("rank", VALID_RANKS)
def test_lowpass_projector_is_the_mean_over_aligned_groups(rank):
    """The r lowest Walsh sequencies span the functions constant on the r aligned groups of
    16 / r consecutive points, so lowpass HLA averages g_y and x over those token groups."""
    p = walsh.hla_matrix(rank, "lowpass").T @ walsh.hla_matrix(rank, "lowpass")
    g = 16 // rank
    want = torch.block_diag(*[torch.full((g, g), 1.0 / g, dtype=torch.float64)] * rank)
    torch.testing.assert_close(p, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("bad", [0, 3, 5, 32, -8])
def test_bad_rank_is_rejected_with_the_value(bad):
    with pytest.raises(HOTConfigError, match=str(bad)):
        walsh.hla_rows(bad, "lowpass")


def test_bad_selection_is_rejected_with_the_value():
    with pytest.raises(HOTConfigError, match="highpass"):
        walsh.hla_rows(8, "highpass")


def test_block_diag_helper():
    h = walsh.hadamard16()
    bd = walsh.block_diag(h, 3)
    assert bd.shape == (48, 48)
    torch.testing.assert_close(bd @ bd.T, _eye(48), atol=TOL, rtol=0)
    assert torch.equal(bd[16:32, 16:32], h) and not bd[:16, 16:].any()
