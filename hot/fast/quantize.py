"""The fast quantizers: hq_quantize, hla_quantize and the fused g_y pass on the GPU (or the
Triton interpreter), and run_pass, the one launch of a quantizer pass from its plan: every pass
starts there (the three quantizers through gy_pass, the fast layer_backward's first call on its
own plan); the C++ launch (hot.fast.native) is a route registered behind it.

Same function as hot.reference (hot.common.ops states it); the stochastic rounding consumes the
hash stream of hot.common.quant, so inside ``quant.hash_rng()`` the reference reproduces the
codes (up to the ~1-ulp transform differences documented in the tests). The op layer hands
bits = 0, float64 and empty inputs to the reference before they get here.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..common.config import DRAWN_SELECTIONS
from ..common.ops import HLAArgs, HQArgs, Quantized
from .gemm import tag_small_codes
from .launch import spec
from .passes import (PassOutputs, PassPlan, PassRoute, check_history, fold_delayed, onepass_args,
                     pass_args, plan_for, resident_programs)


def _check(x: torch.Tensor, what: str) -> None:
    if x.dim() != 2:
        raise ValueError(f"fast {what}: expected a 2-D tensor, got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"fast {what}: dtype {x.dtype} is not supported "
                        f"(float32, bfloat16, float16)")


# Launches of a registered plan's passes other than from Python, tried in order before the
# Python launch (hot.fast registers hot.fast.native's C++ launch).
_ROUTES: list[PassRoute] = []


def register_route(route: PassRoute) -> None:
    """Put ``route`` behind run_pass (after those registered before it)."""
    if route not in _ROUTES:
        _ROUTES.append(route)


def gy_pass(x: torch.Tensor, hq: Optional[HQArgs], hla: Optional[HLAArgs],
            bsum: bool = False) -> PassOutputs:
    """One pass over x (stats, then quantize) for HQ and/or HLA; no memset, no host sync.

    Returns the codes and scales of each part asked for (None for the others; both parts need
    bits > 0) and, with bsum=True (HLA asked for, passes.bsum_capable()), x's column sums in
    float32 (C,) in place of the partials: summed by the stats kernel per row of tiles and then
    over those rows, the bias gradient without another read of x. run_pass on x's plan.
    """
    return run_pass(x, plan_for(x, hq, hla, bsum), hq, hla)


def run_pass(x: torch.Tensor, p: PassPlan, hq: Optional[HQArgs],
             hla: Optional[HLAArgs]) -> PassOutputs:
    """The one launch of a quantizer pass: plan p (plan_for(x, hq, hla, ...)) over x, as gy_pass
    describes its outputs (bias sums summed when p.bsum).

    A delayed HLA scale's pass launches from Python (_launch_delayed). Any other runs on the
    first registered route that has p's kernels for x (the C++ launch, once a Python launch of p
    registered them), else from Python (_launch_python), which offers the kernels it compiled
    to the routes."""
    if hla is not None and hla.selection in DRAWN_SELECTIONS and hla.draw is None:
        raise ValueError(f"fast hla pass: selection {hla.selection!r} needs HLAArgs.draw")
    if p.delayed is not None:
        out = _launch_delayed(x, p, hq, hla)
    else:
        for route in _ROUTES:
            done = route.run(x, p, hq, hla)  # bias sums already summed
            if done is not None:
                return done
        out = _launch_python(x, p, hq, hla)
    return out._replace(bsum=out.bsum.sum(1)) if p.bsum else out


def _launch_python(x: torch.Tensor, p: PassPlan, hq: Optional[HQArgs],
                   hla: Optional[HLAArgs], history: Optional[torch.Tensor] = None) -> PassOutputs:
    """The pass of plan p over x launched from Python (bias sums left as per-tile partials);
    offers the compiled kernels to the routes (``adopt``). ``history``: a delayed HLA scale's,
    folded in between the two kernels (fold_delayed); such a pass is offered to no route,
    since none has the fold."""
    stats_args, quantize_args, out = pass_args(x, p, hq, hla)
    # Launch keys: the plan fixes every shape argument and the alignment of the workspace view
    # and of the fresh outputs. What varies is x's alignment and the seed keys (Triton
    # specializes ints on == 1 and divisibility by 16).
    xa = x.data_ptr() % 16 == 0
    ks = None if p.rows else p.stats(p.grid, stats_args, p.stats_meta, (p.uid, xa))
    if history is not None:
        fold_delayed(quantize_args.hla_amax[:x.shape[1]], history)
    kq = p.quantize(p.grid, quantize_args, p.quantize_meta,
                    (p.uid, xa, spec(quantize_args.hq_key), spec(quantize_args.hla_key)))
    if history is None:
        for route in _ROUTES:
            route.adopt(p, x, ks, kq, (len(stats_args), len(quantize_args)))
    return out


# Pass plan uid -> whether a band of its onepass_kernel fits on the GPU at once.
_BAND_FITS: dict = {}


def _band_fits(p: PassPlan, args) -> bool:
    """Whether every program of a band (a row of tiles) can be resident at once, with room to
    spare for other streams' kernels: at most half the programs the GPU holds (the kernel
    compiled, not run, to read its occupancy). A band that did not fit would wait forever."""
    fits = _BAND_FITS.get(p.uid)
    if fits is None:
        d = p.delayed
        k = d.onepass.fn.warmup(*args, grid=(d.n_rt * d.n_ct,), **d.onepass_meta.kw)
        fits = _BAND_FITS[p.uid] = d.n_ct <= resident_programs(k, args.x.device) // 2
    return fits


def _launch_delayed(x: torch.Tensor, p: PassPlan, hq: Optional[HQArgs],
                    hla: HLAArgs) -> PassOutputs:
    """A pass with a delayed HLA scale (bias sums left as per-tile partials): onepass_kernel
    then fixup_kernel where onepass_kernel serves it, else stats, fold_delayed, quantize.
    Launched from Python (no native plan)."""
    d = p.delayed
    # (a band known not to fit goes straight to the two kernels: no one-read arguments made)
    if d.onepass_ok and (not d.band or _BAND_FITS.get(p.uid) is not False):
        one, fix, out = onepass_args(x, p, hq, hla)
        if not d.band or _band_fits(p, one):
            d.onepass((d.n_rt * d.n_ct,) if d.band else (d.n_rt, d.n_ct), one, d.onepass_meta)
            d.fixup((d.fix_g, d.n_ct), fix, d.fixup_meta)
            return out
    return _launch_python(x, p, hq, hla, check_history(x, hla))


def _codes(q: torch.Tensor, bits: int) -> torch.Tensor:
    # Codes within [-7, 7] may use the packed int4 GEMM on Ampere (hot.fast.gemm).
    return tag_small_codes(q) if bits <= 4 else q


def hq_quantize(x: torch.Tensor, a: HQArgs) -> Quantized:
    _check(x, "hq_quantize")
    o = gy_pass(x, a, None)
    return Quantized(_codes(o.hq_q, a.bits), o.hq_s)


def hla_quantize(x: torch.Tensor, a: HLAArgs) -> Quantized:
    _check(x, "hla_quantize")
    o = gy_pass(x, None, a)
    return Quantized(_codes(o.hla_q, a.bits), o.hla_s)


def gy_quantize(x: torch.Tensor, hq: HQArgs, hla: HLAArgs) -> tuple[Quantized, Quantized]:
    """(hq_quantize(x, hq), hla_quantize(x, hla)) from one read of each tile."""
    _check(x, "gy_quantize")
    o = gy_pass(x, hq, hla)
    return Quantized(_codes(o.hq_q, hq.bits), o.hq_s), Quantized(_codes(o.hla_q, hla.bits),
                                                                  o.hla_s)
