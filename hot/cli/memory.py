"""`hot memory MODEL`: measured saved bytes and the analytic memory model, FP32 / BF16 / HOT."""

from __future__ import annotations

import argparse
import copy
import pathlib

import torch

from ..analysis import memory as M
from ..analysis.peak import record_peak
from ..common.config import DRAWN_SELECTIONS
from ..analysis.saved import OTHER, SavedTensorMeter
from ..analysis.shapes import layer_shapes
from . import argtypes as T
from . import plots
from .. import recipes
from .common import (add_hot_args, add_json_flag, check_backend, device_from, emit, fmt_bytes,
                     hot_config, method_recipe, progress, render_table)
from .modelargs import add_model_args, build_for_analysis
from .outputs import add_overwrite_flag, claim
from .trainer import logits_of


def add_parser(sub) -> None:
    p = sub.add_parser(
        "memory", help="memory per layer and in total for FP32, BF16 and HOT (measured + analytic)",
        description="Run one real forward/backward per method and measure, with saved-tensor "
        "hooks, the bytes autograd keeps for backward in every Linear/Conv2d (parameters "
        "excluded, each storage once), next to the analytic model: weights, gradients, AdamW "
        "state and saved layer inputs. It leads with the totals against the exact baselines "
        "and says when a HOT method keeps more than one of them. On a CUDA device it also says "
        "where the GPU peak goes: the bytes live at it by where they were allocated (the "
        "parameters, a HOT operator, the model's own ops, the loss). Writes a bar chart PNG.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_model_args(p)
    p.add_argument("--methods", type=T.method_list, default="fp32,bf16,hot",
                   help=f"comma-separated methods, each with its own configuration (the "
                        f"quantizer flags shape the tunable ones): {', '.join(recipes.names())}")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--out", default="hot_memory_out", help="folder for memory.png")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    add_overwrite_flag(p)
    add_hot_args(p)
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    device = device_from(args.device)
    check_backend(args, device)
    cfg = hot_config(args, method_recipe("hot"))
    # every method runs with its own recipe's configuration, checked before any work
    chosen = {name: method_recipe(name) for name in args.methods}
    configs = {name: None if r.exact else hot_config(args, r) for name, r in chosen.items()}
    png = pathlib.Path(args.out) / "memory.png"
    if not args.no_plot:
        claim(png.parent, [png.name], args.overwrite)
    built, shape, make, loss_of = build_for_analysis(args)
    base = built.model
    x, y = make(device, torch.Generator().manual_seed(0))
    base = base.to(device)
    shapes = layer_shapes(base, lambda m: logits_of(m, x))
    names = list(dict.fromkeys(s.name for s in shapes))
    state = M.state_bytes(base)
    methods = args.methods
    results = {}
    for name in progress(methods, "memory: forward/backward per method"):
        method, mcfg = chosen[name], configs[name]
        model = method.prepare(copy.deepcopy(base), mcfg, None, args.backend)
        meter = SavedTensorMeter(model)

        def step():
            with meter, method.context(device):
                loss = loss_of(model, x, y)
            loss.backward()

        at_peak = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            start = torch.cuda.memory_allocated(device)
            # where each GiB at the peak was allocated (the allocator's trace of this one step)
            at_peak = record_peak(step, device).as_gib()
        else:
            step()
        peak = (torch.cuda.max_memory_allocated(device) - start) if device.type == "cuda" else None
        analytic, model_name = {}, method.cost.memory
        run = mcfg or cfg
        hla = run.hla
        shared = shared_codes(model, shapes)
        for s in shapes:
            drawn = run.for_layer(s.kind == "conv").hla.selection in DRAWN_SELECTIONS
            analytic[s.name] = analytic.get(s.name, 0) + (0 if s.name in shared else (
                M.analytic_layer_bytes(s, model_name, hla.rank, hla.bits, s.input_requires_grad,
                                       drawn))) if model_name is not None else None
        # None where no analytic model describes the method: no total is better than a wrong one
        an_act = sum(analytic.values()) if model_name is not None else None
        results[name] = {
            "hot_config": None if mcfg is None else mcfg.to_dict(),
            "measured_saved_linear": meter.layer_total,
            "measured_saved_other": meter.by_layer.get(OTHER, 0),
            "measured_saved_total": meter.total,
            "peak_forward_backward_bytes": peak,
            "at_peak": at_peak,
            "analytic": {"weights": state["weights"], "gradients": state["gradients"],
                         "optimizer": state["optimizer"], "activations_linear": an_act,
                         "total": None if an_act is None else (
                             state["weights"] + state["gradients"] + state["optimizer"] + an_act)},
            "layers": {n: {"measured": meter.by_layer.get(n, 0), "analytic": analytic.get(n),
                           "dtypes": sorted(meter.dtypes.get(n, ()))} for n in names},
        }
        del model
    comparison, verdict = compare_totals(results)
    out = {"model": args.model, "batch": args.batch, "input_shape": shape, "device": str(device),
           "hot_config": cfg.to_dict(), "params": state["params"],
           "trainable_params": state["trainable_params"], "methods": results,
           "comparison": comparison, "summary": verdict,
           "notes": "measured = bytes autograd saved for backward (saved-tensor hooks, each "
                    "storage once, parameters excluded; a storage both a layer and another op "
                    "keep is charged to the layer, so where HOT's layer keeps a compressed copy "
                    "instead, that storage moves to other ops); analytic activations = saved "
                    "inputs of Linear/Conv2d layers only (see hot.analysis.memory)"}
    if not args.no_plot:
        out["plot"] = plots.memory_bars(
            names, {m: [results[m]["layers"][n]["measured"] for n in names] for m in methods},
            png, f"{args.model}, batch {args.batch}")
    emit(args, out, _text(out, methods, names))
    return 0


def shared_codes(model, shapes) -> set:
    """Names of the HOT layers that keep no codes of their own: under HLAConfig(share=
    "siblings") they read the same input as their group source (hot.nn.groups), whose codes
    they share (layer_shapes' ``source``)."""
    from .. import hot_layers
    from ..nn.groups import abc_source

    names = {id(layer): name for name, layer in hot_layers(model)}
    read = {s.name: s.source for s in shapes}
    out = set()
    for name, layer in hot_layers(model):
        src = abc_source(layer)
        if src is not layer and names.get(id(src)) in read and name in read \
                and read[names[id(src)]] == read[name]:
            out.add(name)
    return out


def compare_totals(results: dict) -> tuple[dict, list[str]]:
    """Every method's measured saved-for-backward total as a ratio of each exact baseline's
    (the methods without HOT), and one sentence per HOT method that says how it compares,
    plainly so where it keeps more than a baseline."""
    baselines = [m for m in results if recipes.get(m).exact]
    total = {m: r["measured_saved_total"] for m, r in results.items()}
    comparison = {m: {b: total[m] / total[b] for b in baselines if total[b]} for m in results}
    verdict = []
    for m in (m for m in results if not recipes.get(m).exact):
        if not baselines:
            verdict.append(f"{m} keeps {fmt_bytes(total[m])} for backward; no exact baseline "
                           f"was measured (add fp32 or bf16 to --methods to compare).")
            continue
        parts = [f"{comparison[m][b]:.2f}x {b}'s {fmt_bytes(total[b])} "
                 f"({_pct(total[m], total[b])})" for b in baselines if b in comparison[m]]
        verdict.append(f"{m} keeps {fmt_bytes(total[m])} for backward in all: "
                       + ", ".join(parts) + ".")
        for b in (b for b in baselines if total[m] > total[b]):
            r, rb = results[m], results[b]
            verdict.append(
                f"So {m} keeps MORE than {b}: it compresses only what Linear/Conv layers save "
                f"({fmt_bytes(r['measured_saved_linear'])} against {b}'s "
                f"{fmt_bytes(rb['measured_saved_linear'])}), and the other ops (attention, norms, "
                f"activations) keep {fmt_bytes(r['measured_saved_other'])} against {b}'s "
                f"{fmt_bytes(rb['measured_saved_other'])}."
                + (" hot-bf16 (HOT under bf16 autocast) keeps both savings: add it to "
                   "--methods to measure it."
                   if m == "hot" and b == "bf16" and "hot-bf16" not in results else ""))
    return comparison, verdict


def _pct(x: float, ref: float) -> str:
    if x == ref:
        return "the same"
    return f"{abs(x - ref) / ref:.0%} " + ("less" if x < ref else "MORE")


def _text(out: dict, methods: list[str], names: list[str]) -> str:
    results, comparison = out["methods"], out["comparison"]
    baselines = [m for m in methods if recipes.get(m).exact]
    summ = [[m, fmt_bytes(r["measured_saved_total"]),
             *[f"{comparison[m][b]:.2f}x" if b in comparison[m] else "n/a" for b in baselines],
             fmt_bytes(r["measured_saved_linear"]), fmt_bytes(r["measured_saved_other"]),
             fmt_bytes(r["analytic"]["weights"] + r["analytic"]["gradients"]
                       + r["analytic"]["optimizer"]),
             fmt_bytes(r["peak_forward_backward_bytes"])] for m, r in results.items()]
    lead = render_table(["method", "saved for backward", *[f"vs {b}" for b in baselines],
                         "in Linear/Conv", "in other ops", "weights+grads+AdamW",
                         "GPU peak fwd+bwd"], summ)
    rows = []
    for n in names:
        row = [n]
        for m in methods:
            L = results[m]["layers"][n]
            row += [fmt_bytes(L["measured"]), fmt_bytes(L["analytic"])]
        rows.append(row)
    tot = ["Linear/Conv total"]
    for m in methods:
        tot += [fmt_bytes(results[m]["measured_saved_linear"]),
                fmt_bytes(results[m]["analytic"]["activations_linear"])]
    rows.append(tot)
    hdr = ["layer"] + [f"{m} {k}" for m in methods for k in ("measured", "model")]
    return "\n".join([
        f"{out['model']}, batch {out['batch']}, one training step on {out['device']}:", "",
        lead, "", *out["summary"], "", "Per layer:", render_table(hdr, rows), "",
        *_at_peak_lines(results), f"{out['notes']}."]
        + ([f"plot: {out['plot']}"] if out.get("plot") else []))


def _at_peak_lines(results: dict) -> list[str]:
    """Where each method's GPU peak goes (hot.analysis.peak), one line per method; none on a
    device without the caching allocator's trace."""
    lines = [f"{m}: peak {r['at_peak']['peak_GiB']:.3f} GiB = "
             + ", ".join(f"{o} {g:.3f}" for o, g in r["at_peak"]["live_GiB"].items())
             for m, r in results.items() if r.get("at_peak")]
    return ["Where the GPU peak goes (GiB live at the peak, by where it was allocated):",
            *lines, ""] if lines else []
