"""Differential tests of the fast quantizers against the reference (Triton interpreter on CPU,
or compiled on a GPU when one is present), bit-exact in the hash-stream test mode up to the
boundary flips tests/fast/_fast_diff.py derives (float summation order of the transforms)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hot.common import quant
from hot.common.walsh import hadamard16
from hot.fast import passes
from hot.fast import quantize as fq
from hot.fast.launch import Meta
from hot.common.transforms import hla_transform, hq_transform
from hot.reference import ops as ref

from _fast_diff import DEVICE, EPS32, check_codes, hla_args, hq_args, x_with_product_near

shapes = st.tuples(st.integers(1, 70), st.integers(1, 70))
bits_s = st.sampled_from([4, 8])
mode_s = st.sampled_from(["row", "tensor"])


def _x(shape, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * scale
    # Heavy-tailed rows/columns: the per-row and per-tensor scales then differ a lot.
    x[: max(1, shape[0] // 5)] *= 30
    return x.to(dtype).to(DEVICE)


def _hla_tol(x, s_ref, bits):
    xmax = x.float().abs().amax(0).cpu().reshape(-1, 1)  # per column c = per row of q
    return EPS32 * (64 * xmax / s_ref.cpu() + 2 * quant.qmax(bits))


@given(shapes, bits_s, mode_s, st.booleans(), st.sampled_from([torch.float32, torch.bfloat16]),
       st.integers(0, 2**31 - 1))
def test_hq_matches_reference(shape, bits, mode, stoch, dtype, seed):
    x = _x(shape, dtype, seed % 1000)
    a = hq_args(bits, mode, stoch, seed)
    q, s = fq.hq_quantize(x, a)
    with quant.hash_rng():
        qr, sr = ref.hq_quantize(x, a)
    check_codes(q, s, qr, sr, hq_transform(x), bits, stoch, seed)


@given(shapes, st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from(["lowpass", "lp_l1"]), bits_s,
       mode_s, st.booleans(), st.integers(0, 2**31 - 1))
def test_hla_matches_reference(shape, rank, sel, bits, mode, stoch, seed):
    x = _x(shape, torch.float32, seed % 1000)
    a = hla_args(rank, sel, bits, mode, stoch, seed)
    q, s = fq.hla_quantize(x, a)
    with quant.hash_rng():
        qr, sr = ref.hla_quantize(x, a)
    check_codes(q, s, qr, sr, hla_transform(x, rank, sel), bits, stoch, seed,
                tol=_hla_tol(x, sr, bits))


def _drawn_tol(x, s_ref, bits):
    # As _hla_tol with the largest row constant 1/2 instead of 1/4 (a row of weight 4 is
    # sqrt(4) / 4 times +-1): |dz| <= 16 terms * 16 eps * max|x| / 2 = 128 eps max|x|.
    xmax = x.float().abs().amax(0).cpu().reshape(-1, 1)
    return EPS32 * (128 * xmax / s_ref.cpu() + 2 * quant.qmax(bits))


@settings(max_examples=25, deadline=None)
@given(shapes, st.sampled_from([4, 8, 16]), bits_s, mode_s, st.booleans(),
       st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
def test_drawn_hla_matches_reference(shape, rank, bits, mode, stoch, seed, draw):
    """HLAConfig(selection="stratified"): the kernels' per-block signs, kept weighted rows and
    all-row absmax are the reference's drawn_transform (codes up to boundary flips)."""
    x = _x(shape, torch.float32, seed % 1000)
    a = hla_args(rank, "stratified", bits, mode, stoch, seed)._replace(draw=draw)
    q, s = fq.hla_quantize(x, a)
    with quant.hash_rng():
        qr, sr = ref.hla_quantize(x, a)
    check_codes(q, s, qr, sr, hla_transform(x, rank, "stratified", draw), bits, stoch, seed,
                tol=_drawn_tol(x, sr, bits))


def test_drawn_hla_follows_the_step_counter_and_differs_by_draw():
    """A drawn selection's seed may follow a step counter (a StepSeed, as layers pass it): the
    kernel forms the key from the counter in device memory, as the reference does from the
    step; and another draw keeps other rows (the codes change)."""
    x = _x((64, 24), torch.float32, 4)
    counter = torch.tensor(7, dtype=torch.int64, device=DEVICE)
    base = hla_args(8, "stratified", 8, "row", True, 0)
    a = base._replace(seed=quant.StepSeed(11, counter, 7), draw=quant.StepSeed(13, counter, 7))
    q, s = fq.hla_quantize(x, a)
    with quant.hash_rng():
        qr, sr = ref.hla_quantize(x, a)
    check_codes(q, s, qr, sr, hla_transform(x, 8, "stratified", quant.seed_value(a.draw)), 8,
                True, quant.seed_value(a.seed), tol=_drawn_tol(x, sr, 8))
    counter.fill_(8)  # the next step: another draw, the same scales (the all-row absmax)
    q2, s2 = fq.hla_quantize(x, a)
    assert torch.equal(s2, s) and not torch.equal(q2, q)


def test_strided_input_weight_transpose():
    # The weight operand is hq_quantize(W^T) on a transposed view: no copy, same result.
    w = torch.randn(40, 24, device=DEVICE)
    q1, s1 = fq.hq_quantize(w.t(), hq_args(4, "row", True, 5))
    q2, s2 = fq.hq_quantize(w.t().contiguous(), hq_args(4, "row", True, 5))
    assert torch.equal(q1, q2) and torch.equal(s1, s2)


def test_fused_gy_pass_equals_two_ops():
    x = _x((50, 40), torch.float32, 3)
    hq, hla = hq_args(4, "row", True, 11), hla_args(8, "lowpass", 8, "row", True, 12)
    a, b = fq.gy_quantize(x, hq, hla)
    for u, v in zip((*a, *b), (*fq.hq_quantize(x, hq), *fq.hla_quantize(x, hla))):
        assert torch.equal(u, v)


def test_forward_pass_equals_two_ops():
    """The quantized forward's pass over x (hot.nn.forward): HQ 8-bit nearest per token with
    ABC's drawn stochastic HLA codes following a step counter, from one read, equals the two
    operations (and HQ's part the reference's codes)."""
    from hot.nn.forward import forward_args

    x = _x((70, 40), torch.bfloat16, 5)
    counter = torch.tensor(3, dtype=torch.int64, device=DEVICE)
    hq = forward_args("int8")
    hla = hla_args(8, "stratified", 8, "row", True, 0)._replace(
        seed=quant.StepSeed(21, counter, 3), draw=quant.StepSeed(22, counter, 3))
    a, b = fq.gy_quantize(x, hq, hla)
    for u, v in zip((*a, *b), (*fq.hq_quantize(x, hq), *fq.hla_quantize(x, hla))):
        assert torch.equal(u, v)
    qr, sr = ref.hq_quantize(x, hq)
    check_codes(a.q, a.scale, qr, sr, hq_transform(x), 8, False, 0)


# (shape, dtype, transposed view, hq (bits, mode, stoch, seed) or None,
#  hla (rank, selection, bits, mode, stoch, seed) or None). Shapes but the last are not multiples
# of the 64-row tile nor of 16; together they cover fp32/bf16/fp16, 'row' and 'tensor' scales,
# HQ only, HLA only and fused, ranks 1-16 (1 both nearest and stochastic), both selections,
# nearest and stochastic rounding.
CASES = [
    ((50, 70), torch.float32, False, (4, "row", True, 11), (8, "lowpass", 8, "row", True, 12)),
    ((37, 21), torch.bfloat16, False, (8, "tensor", False, 3), (16, "lp_l1", 8, "tensor", True, 4)),
    ((70, 33), torch.float16, False, None, (1, "lowpass", 4, "row", False, 5)),
    ((19, 48), torch.float32, False, None, (2, "lp_l1", 8, "tensor", True, 6)),
    ((66, 40), torch.bfloat16, False, (4, "row", True, 7), (4, "lowpass", 8, "row", True, 8)),
    ((40, 24), torch.float32, True, (4, "row", True, 9), None),  # W^T as a transposed view
    # Rank 1 stochastic: no pair within a block, the kernels hash per code (_u_at).
    ((45, 26), torch.float32, False, None, (1, "lowpass", 8, "row", True, 13)),
    # Multiples of the 64 x 64 tile: the EVEN kernels (unmasked loads and stores).
    ((128, 192), torch.bfloat16, False, (4, "row", True, 14), (8, "lowpass", 8, "row", True, 15)),
]


def test_pass_matches_reference_over_the_case_matrix():
    flips = 0
    for i, (shape, dtype, tr, hq, hla) in enumerate(CASES):
        x = _x(shape, dtype, i)
        x = x.t().contiguous().t() if tr else x  # same values, column-major strides
        hq = hq_args(*hq) if hq else None
        hla = hla_args(*hla) if hla else None
        out = fq.gy_pass(x, hq, hla)
        if hq:
            with quant.hash_rng():
                qr, sr = ref.hq_quantize(x, hq)
            flips += check_codes(out.hq_q, out.hq_s, qr, sr, hq_transform(x), hq.bits,
                                 hq.stochastic, hq.seed)
        else:
            assert out.hq_q is None and out.hq_s is None
        if hla:
            with quant.hash_rng():
                qr, sr = ref.hla_quantize(x, hla)
            flips += check_codes(out.hla_q, out.hla_s, qr, sr,
                                 hla_transform(x, hla.rank, hla.selection), hla.bits,
                                 hla.stochastic, hla.seed, tol=_hla_tol(x, sr, hla.bits))
        else:
            assert out.hla_q is None and out.hla_s is None
    # Over ~25k codes a handful of boundary flips at most (check_codes bounds each case).
    assert flips <= 20, flips


@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_zero_and_nonfinite_groups(mode):
    x = torch.randn(32, 32)
    x[3] = 0.0
    x[5, 7] = float("nan")
    x[9, 2] = float("inf")
    x = x.to(DEVICE)
    q, s = fq.hq_quantize(x, hq_args(4, mode, True, 1))
    qr, sr = ref.hq_quantize(x, hq_args(4, mode, True, 1))
    if mode == "row":
        assert s[3].item() == 1.0 and (q[3] == 0).all()
        assert torch.isnan(s[5]).all() and not torch.isfinite(s[9]).all()
        assert (q[5] == 0).all() and (q[9] == 0).all()
        assert torch.isfinite(s[[0, 1, 2, 4]]).all()
    else:
        assert torch.isnan(s).all() and (q == 0).all()
    # An Inf input gives the reference an Inf scale and the fast kernels a NaN one (Inf times
    # the zero entries of the block-diagonal transform matrix); both poison the same rows and
    # all their codes are 0, so the gradient is equally non-finite. NaN inputs give NaN in both.
    assert torch.equal(torch.isfinite(s.cpu()), torch.isfinite(sr.cpu()))
    assert not torch.isnan(sr.cpu()).logical_and(~torch.isnan(s.cpu())).any()
    assert torch.equal(q.cpu(), qr.cpu()) if mode == "tensor" else torch.equal(q[[3, 5, 9]].cpu(), qr[[3, 5, 9]].cpu())
    qh, sh = fq.hla_quantize(x, hla_args(8, "lowpass", 8, "row", False, 0))
    # Column 7 holds the NaN and column 2 the Inf: their scales are non-finite, their codes 0.
    assert torch.isnan(sh[7]).all() and not torch.isfinite(sh[2]).all()
    assert (qh[7] == 0).all() and (qh[2] == 0).all() and torch.isfinite(sh[0]).all()


@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 1000))
def test_hadamard_orthogonality_error_bound(r, c, seed):
    """Nearest rounding at 8 bits, then the inverse transform (H is its own inverse): every
    element's error is <= scale/2 in the transformed domain, so the block's l2 error back in x's
    domain is <= sqrt(16) * scale / 2 (H orthonormal preserves l2 norms)."""
    x = _x((r, c), torch.float32, seed)
    q, s = fq.hq_quantize(x, hq_args(8, "row", False, 0))
    c16 = q.shape[1]
    back = ((q.float() * s).reshape(r, c16 // 16, 16) @ hadamard16().float().to(DEVICE))
    xp = torch.nn.functional.pad(x, (0, c16 - c)).reshape(r, c16 // 16, 16)
    err = (back - xp).norm(dim=2)
    bound = 4 * s / 2 * (1 + 1e-5)
    assert (err <= bound).all()


@settings(max_examples=4)  # each example is 64 draws; the interpreter runs ~40 ms per tile
@given(st.integers(0, 10**6), bits_s)
def test_stochastic_rounding_unbiased(seed, bits):
    """N independent draws in one launch: x repeated N times along rows ('row' scales are then
    equal, and every copy gets its own hash counters). Per element the SR error has mean 0 and
    variance s^2 f(1-f) <= s^2/4, so the mean over N draws has E[err^2] <= s^2/(4N). Averaged over
    E = 512 elements the mean squared error concentrates (relative sd <= sqrt(2/E) ~ 0.06), so
    1.5x the upper bound fails only on a real bias. The signed mean over everything has
    sd <= max(s)/(2 sqrt(N E)); 5 sd bound it."""
    n = 64
    x = _x((16, 32), torch.float32, seed % 997)
    t = hq_transform(x).to(DEVICE)
    q, s = fq.hq_quantize(x.repeat(n, 1), hq_args(bits, "row", True, seed))
    deq = (q.float() * s).reshape(n, *t.shape).mean(0)
    assert torch.equal(s, s[: t.shape[0]].repeat(n, 1))
    s = s[: t.shape[0]]
    err = deq - t
    assert ((err / s) ** 2).mean().item() <= 1.5 / (4 * n)
    assert abs((err / s).mean().item()) <= 5 / (2 * (n * err.numel()) ** 0.5)


def test_absmax_workspace_forgets_earlier_calls():
    # Each pass's absmax vector starts from zeros (hot.fast.passes.absmax_workspace): a call after
    # one with 1e6 times larger values must still get its own scales.
    big = torch.randn(48, 40, device=DEVICE) * 1e6
    small = torch.randn(48, 40, device=DEVICE)
    for mode in ("row", "tensor"):
        hq, hla = hq_args(4, mode, False, 1), hla_args(8, "lowpass", 8, mode, False, 2)
        fq.gy_quantize(big, hq, hla)
        (q1, s1), (q2, s2) = fq.gy_quantize(small, hq, hla)
        qr1, sr1 = ref.hq_quantize(small, hq)
        qr2, sr2 = ref.hla_quantize(small, hla)
        torch.testing.assert_close(s1, sr1, rtol=1e-6, atol=0)
        torch.testing.assert_close(s2, sr2, rtol=1e-6, atol=0)
        assert (q1.int() - qr1.int()).abs().max() <= 1 and (q2.int() - qr2.int()).abs().max() <= 1


def _with_meta(p, **changes):
    """Plan p with kernel switches changed (e.g. forced int64 offsets), as its own plan."""
    import dataclasses

    return dataclasses.replace(p, uid=-id(changes),
                               stats_meta=Meta(**{**p.stats_meta.kw, **changes}),
                               quantize_meta=Meta(**{**p.quantize_meta.kw, **changes}))


@pytest.mark.parametrize("idx64", [False, True])
def test_int32_and_int64_offsets_agree(idx64):
    # The kernels use int32 offsets unless a tensor can pass 2^31 elements; both variants must
    # give the reference's codes (the int64 one is forced here on a small tensor).
    x = _x((37, 50), torch.float32, 3)
    hq, hla = hq_args(4, "row", True, 11), hla_args(8, "lowpass", 8, "row", True, 12)
    p = passes.plan_for(x, hq, hla)
    assert p.stats_meta.kw["IDX64"] is False
    out = fq.run_pass(x, _with_meta(p, IDX64=idx64), hq, hla)
    with quant.hash_rng():
        qr1, sr1 = ref.hq_quantize(x, hq)
        qr2, sr2 = ref.hla_quantize(x, hla)
    check_codes(out.hq_q, out.hq_s, qr1, sr1, hq_transform(x), 4, True, 11)
    check_codes(out.hla_q, out.hla_s, qr2, sr2, hla_transform(x, 8, "lowpass"), 8, True, 12,
                tol=_hla_tol(x, sr2, 8))


def _butterfly16(x):
    """kernels.quantize._fwht16 in float32, stage by stage in the kernel's order: x (..., 16)."""
    xs = list(x.unbind(-1))
    for st in range(4):
        xs = [xs[i] + xs[i + (1 << st)] if not (i >> st) & 1 else xs[i - (1 << st)] - xs[i]
              for i in range(16)]
    return torch.stack(xs, -1)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from([1.0, 2.0**-60, 2.0**60]),
       st.sampled_from([7, 127]))
def test_nearest_hq_codes_need_no_clamp(seed, mag, qmax):
    """The GPU quantize kernel rounds nearest HQ codes without a clamp (_round's BOUNDED): v =
    y * (r / 4) with y from the butterfly and r = 1 / (amax / qmax) from the stats kernel's
    dot, which sums the same 16 products in another order. The claim: |v| <= qmax (1 + 2^-15)
    < qmax + 1/2, so rounding to nearest never passes qmax. Checked in float32 with the two
    orders (a matmul for the dot, the butterfly stage by stage) on rows that cancel (pairs of
    nearly opposite values, where the orders differ most) and heavy-tailed rows."""
    from hot.common.walsh import sylvester

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 64, generator=g) * mag
    x[:128, 1::2] = -x[:128, 0::2] * (1 + 2.0**-7 * torch.randn(128, 32, generator=g))
    x[128:] *= torch.randn(128, 64, generator=g).abs() ** 4
    x = x.to(torch.bfloat16).float()
    blocks = x.view(256, 4, 16)
    t_dot = blocks @ (sylvester(16).float() / 4)
    amax = t_dot.abs().amax(dim=(1, 2), keepdim=True)
    r = 1.0 / torch.where(amax == 0, torch.ones_like(amax), amax / qmax)
    v = _butterfly16(blocks) * (r * 0.25)
    assert bool((v.abs() <= qmax * (1 + 2.0**-15)).all())


def test_ops_layer_reaches_the_fast_implementations():
    # The op layer (hot.common.ops) dispatches to the fast implementations for int8 work and
    # returns their outputs unchanged.
    from hot.common import ops

    g = _x((37, 40), torch.float32, 3)
    hq, hla = hq_args(4, "row", True, 1), hla_args(8, "lowpass", 8, "row", True, 2)
    direct = fq.gy_quantize(g, hq, hla)
    via_op = ops.gy_quantize(g, hq, hla, "fast")
    for a, b in zip((*direct[0], *direct[1]), (*via_op[0], *via_op[1])):
        assert torch.equal(a, b)
    w = _x((24, 40), torch.float32, 4)
    for a, b in zip(fq.hq_quantize(w.t(), hq_args(4, "tensor", True, 3)),
                    ops.hq_quantize(w.t(), hq_args(4, "tensor", True, 3), "fast")):
        assert torch.equal(a, b)


def test_kernel_argument_bundles_name_the_kernel_parameters():
    # StatsArgs / QuantizeArgs are the kernels' runtime parameters in signature order (the native
    # launch and the launch keys rely on it), and pass_args fills them with what it was given.
    from hot.fast.kernels.quantize import quantize_kernel, stats_kernel

    names = lambda k: [n[:-4] if n.endswith("_ptr") else n for n in k.arg_names]  # noqa: E731
    assert list(passes.StatsArgs._fields) == names(stats_kernel)[:len(passes.StatsArgs._fields)]
    assert list(passes.QuantizeArgs._fields) == \
        names(quantize_kernel)[:len(passes.QuantizeArgs._fields)]
    from hot.fast.kernels.quantize import fixup_kernel, onepass_kernel

    for bundle, kernel in ((passes.OnepassArgs, onepass_kernel), (passes.FixupArgs, fixup_kernel)):
        assert list(bundle._fields) == names(kernel)[:len(bundle._fields)]
    x = _x((20, 24), torch.float32, 1)
    hq, hla = hq_args(4, "row", True, 11), hla_args(8, "lowpass", 8, "row", True, 22)
    p = passes.plan_for(x, hq, hla)
    stats_args, quantize_args, _ = passes.pass_args(x, p, hq, hla)
    assert stats_args.hq_amax.dtype == torch.int32 and not stats_args.hq_amax.any()  # zeroed
    assert quantize_args.hq_key == passes.seed_key(11)
    assert quantize_args.hla_key == passes.seed_key(22)


def test_sel_packs_the_kept_sylvester_rows():
    # T_r row t must equal sylvester(16) row n_t / 4 (the kernels' z_t = y[n_t] / 4).
    from hot.common.walsh import hla_matrix, sylvester

    for rank in (1, 2, 4, 8, 16):
        for sel in ("lowpass", "lp_l1"):
            packed = passes.sel_code(rank, sel)
            n = [(packed >> (4 * t)) & 15 for t in range(rank)]
            assert torch.equal(sylvester(16)[n] / 4, hla_matrix(rank, sel))


def _exact_case(x_c, d, seed, stochastic):
    """Inputs whose transforms the kernels compute exactly (one nonzero per block of 16, the
    matrices' entries +-1/4): HQ row 0 = x_c at columns 0-15 and 7 d at 16-31 (scale d); HLA
    column 0 = x_c at coefficients (block 0) and 7 d (block 1) for every kept t (the first
    column of every Walsh row is +1/4). Returns (reference outputs, fast outputs)."""
    x = torch.zeros(32, 32)
    x[0, 0], x[0, 16] = 4 * x_c, 4 * 7.0 * d
    x[16, 0] = 4 * 7.0 * d
    hq, hla = hq_args(4, "row", stochastic, seed), hla_args(4, "lowpass", 4, "row", stochastic, seed)
    # The expectation from the reference on the CPU, whose float32 products are exact here; a
    # GPU GEMM need not be (TF32 or split sums), and this case tests the kernels' epilogue.
    with quant.hash_rng():
        want = (*ref.hq_quantize(x, hq), *ref.hla_quantize(x, hla))
    assert torch.equal(hq_transform(x)[0, :16], torch.full((16,), x_c))
    assert torch.equal(hla_transform(x, 4, "lowpass")[0, :4], torch.full((4,), x_c))
    assert want[1][0].item() == d and want[3][0].item() == d
    return want, fq.gy_pass(x.to(DEVICE), hq, hla)[:4]


def test_epilogue_is_not_contracted_stochastic():
    """The kernels must round t * r before adding u (compiled with enable_fp_fusion=False). Case
    built as in tests/common/test_quant.py: t = x_c with fl32(x_c * r) == -u exactly at code
    index 1 (HQ row 0 col 1 and HLA column 0 coefficient 1: the same index and seed, so the same
    u) while the exact product is below -u by less than half an ulp: the spec's code there is
    0, an FMA's -1. Every code of this input is exact in every variant, so no flip is allowed."""
    import numpy as np

    seed = 4
    u = quant.hash_uniform(seed, (1, 2))[0, 1].item()
    hit = x_with_product_near(-u, -1)
    assert hit is not None
    x_c, d = hit
    r = float(np.float32(1.0) / np.float32(d))
    assert np.floor(np.float32(x_c * r + u)) == -1  # what a contracted t * r + u gives
    want, got = _exact_case(x_c, d, seed, True)
    assert want[0][0, 1].item() == 0 and want[2][0, 1].item() == 0
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu())


def test_epilogue_is_not_contracted_nearest():
    """Half-even on fl32(t * r): t * r rounds onto 2.5 (a tie, to 2) while the exact product is
    above it (7.5 * fl32(1/3)), so v - floor(v) contracted into an FMA would give d > 1/2 and
    code 3."""
    hit = x_with_product_near(2.5, 1)
    assert hit is not None
    x_c, d = hit
    want, got = _exact_case(x_c, d, 0, False)
    assert (want[0][0, :16] == 2).all() and (want[2][0, :4] == 2).all()
    for a, b in zip(got, want):
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("stochastic", [True, False])
def test_tiny_groups_flush_like_the_reference(stochastic):
    # HQ row 0 and HLA column 0: amax 2^-126, 4-bit scale 2^-126 / 7 < 2^-128, so 1 / scale
    # overflows: codes 0, scale kept (quant.reciprocal). HQ row 1 and HLA column 1: amax
    # 2^-120, ordinary codes +-7. (A single nonzero per block: exact transforms, t = +-x / 4.)
    x = torch.zeros(32, 32)
    x[0, 0] = x[16, 0] = 2.0**-124
    x[1, 16] = x[17, 1] = 2.0**-118
    x = x.to(DEVICE)
    hq, hla = hq_args(4, "row", stochastic, 5), hla_args(4, "lowpass", 4, "row", stochastic, 6)
    with quant.hash_rng():
        want = (*ref.hq_quantize(x, hq), *ref.hla_quantize(x, hla))
    tiny_scale = (torch.tensor(2.0**-126) / 7).item()  # float32 division, a subnormal
    assert (want[0][0] == 0).all() and want[1][0].item() == tiny_scale
    assert (want[0][1, 16:] == 7).all()
    assert (want[2][0] == 0).all() and want[3][0].item() == tiny_scale
    assert (want[2][1, 4:8].abs() == 7).all()
    for a, b in zip(fq.gy_pass(x, hq, hla)[:4], want):
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("shape", [(37, 50), (64, 64), (130, 17), (2100, 20)])
def test_bias_sums_from_the_stats_kernel(shape):
    """gy_pass(bsum=True): the column sums the stats kernel forms per row of tiles (2100 rows:
    33 of them), summed over those rows, against a float64 sum, and the same codes and scales as
    without them. Bound: a float32 sum of n
    terms in any order is within (n - 1) * 2^-24 * sum |x| of the exact sum (each addition
    rounds once, relative error <= 2^-24); n = rows, plus 2^-24 * |sum| for the final rounding."""
    assert passes.bsum_capable()
    x = _x(shape, torch.bfloat16, 7)
    hq, hla = hq_args(4, "row", True, 11), hla_args(8, "lowpass", 8, "row", True, 12)
    *codes, colsum = fq.gy_pass(x, hq, hla, bsum=True)
    exact = x.double().sum(0)
    bound = (shape[0] - 1) * 2.0**-24 * x.double().abs().sum(0) + 2.0**-24 * exact.abs()
    assert colsum.dtype == torch.float32 and colsum.shape == (shape[1],)
    assert bool(((colsum.double() - exact).abs() <= bound).all())
    for a, b in zip(codes, fq.gy_pass(x, hq, hla)[:4]):
        assert torch.equal(a, b)  # the sums change no code and no scale
    with pytest.raises(ValueError, match="bsum"):
        fq.gy_pass(x, hq, None, bsum=True)  # the sums come from the HLA part


def test_step_seeds_follow_the_counter_in_device_memory():
    """A StepSeed's key is formed in the kernel from the counter it reads: the codes equal those
    of the int seed quant.step_seed(base, step) for the counter's value, for both parts, and
    move when the counter moves (what lets a CUDA graph replay round with its own step)."""
    from hot.common.quant import StepSeed, step_seed

    x = _x((40, 48), torch.float32, 5)
    counter = torch.zeros((), dtype=torch.int64, device=DEVICE)
    outs = []
    for step in (7, 8, 2**33 + 7):  # the kernels use the step mod 2^32
        counter.fill_(step)
        s = StepSeed(12345, counter, step)
        got = fq.gy_pass(x, hq_args(4, "row", True, s), hla_args(8, "lowpass", 8, "row", True, s))
        want = fq.gy_pass(x, hq_args(4, "row", True, step_seed(12345, step)),
                          hla_args(8, "lowpass", 8, "row", True, step_seed(12345, step)))
        for a, b in zip(got[:4], want[:4]):
            assert torch.equal(a, b)
        with quant.hash_rng():
            qr, sr = ref.hq_quantize(x, hq_args(4, "row", True, s))
        check_codes(got.hq_q, got.hq_s, qr, sr, hq_transform(x), 4, True, step_seed(12345, step))
        outs.append(got.hq_q)
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_rows_plan_only_for_per_row_hq_alone_over_contiguous_rows():
    """rows_kernel serves exactly the passes it can do alone: HQ with per-row scales, no HLA
    part, no bias sums, rows laid out contiguously; every other pass keeps the two kernels."""
    x = _x((48, 40), torch.float32, 1)
    row, tensor = hq_args(8, "row", False, 0), hq_args(8, "tensor", False, 0)
    hla = hla_args(8, "lowpass", 8, "row", True, 2)
    p = passes.plan_for(x, row, None)
    assert p.rows and p.stats is None and p.grid[1:] == (1, 1)
    assert not passes.plan_for(x, row, None, whole_rows=False).rows
    assert not passes.plan_for(x, tensor, None).rows
    assert not passes.plan_for(x, row, hla).rows
    assert not passes.plan_for(x.t(), row, None).rows  # a W^T view: the row is strided


@pytest.mark.parametrize("shape,dtype,bits,stoch", [
    ((48, 40), torch.float32, 8, False),     # EVEN-less: 40 columns in one 64-wide chunk
    ((64, 64), torch.bfloat16, 8, False),    # one 64 x 64 tile a program, unmasked
    ((37, 200), torch.bfloat16, 4, True),    # 208 padded columns, rows past R masked
    ((5, 4100), torch.float32, 4, True),     # two chunks of 4096 columns, one row a program
    ((3, 1), torch.float32, 8, True),        # one column: 15 padding columns of zeros
])
def test_rows_kernel_equals_the_two_kernel_pass(shape, dtype, bits, stoch):
    """rows_kernel takes the rows' absmax with the stats kernel's dot on a tile of the same
    size, and rounds with quantize_kernel's code: the same scales and codes, bit for bit, as
    the two kernels (which tests above compare with the reference), also with step seeds."""
    from hot.common.quant import StepSeed

    x = _x(shape, dtype, sum(shape))
    x[-1, -1] = 50 * x.abs().max()  # the last row's absmax in its last chunk and block
    counter = torch.full((), 9, dtype=torch.int64, device=DEVICE)
    for seed in (3, StepSeed(77, counter, 9)):
        a = hq_args(bits, "row", stoch, seed)
        one = passes.plan_for(x, a, None)
        two = passes.plan_for(x, a, None, whole_rows=False)
        assert one.rows and not two.rows
        got, want = fq.run_pass(x, one, a, None), fq.run_pass(x, two, a, None)
        assert torch.equal(got.hq_s, want.hq_s) and torch.equal(got.hq_q, want.hq_q)
        assert got.hq_q.shape == (shape[0], passes.pad_to(shape[1]))


def test_rows_pass_reads_no_workspace(monkeypatch):
    """A rows plan allocates no absmax workspace (so no memset kernel runs with it); its
    zero, NaN and Inf rows come out as the two-kernel pass's."""
    x = torch.randn(32, 48)
    x[3] = 0.0
    x[5, 7] = float("nan")
    x[9, 2] = float("inf")
    x = x.to(DEVICE)
    a = hq_args(8, "row", False, 0)
    want = fq.run_pass(x, passes.plan_for(x, a, None, whole_rows=False), a, None)

    def no_workspace(*args):
        raise AssertionError("a rows plan asked for an absmax workspace")

    monkeypatch.setattr(passes, "absmax_workspace", no_workspace)
    got = fq.run_pass(x, passes.plan_for(x, a, None), a, None)
    assert torch.equal(got.hq_q, want.hq_q)
    assert torch.equal(got.hq_s.isnan(), want.hq_s.isnan())
    assert torch.equal(torch.nan_to_num(got.hq_s), torch.nan_to_num(want.hq_s))
    assert got.hq_s[3].item() == 1.0 and torch.isnan(got.hq_s[5]).all()
    assert not torch.isfinite(got.hq_s[9]).all() and (got.hq_q[[3, 5, 9]] == 0).all()
