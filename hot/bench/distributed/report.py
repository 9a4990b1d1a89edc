"""The verdicts of the correctness checks, the speed rows, the JSON file and the Markdown table.

Tolerances:

* exact: HOTConfig.exact() makes HOT's gradients autograd's up to float rounding, so the 2-rank
  curve (each rank half of the global batch, gradients averaged by DDP's all-reduce or FSDP2's
  reduce-scatter) and the 1-process curve (the whole batch) compute the same sums in another
  order. The curves run in float32 (no TF32): one such sum of n terms moves by about
  sqrt(n) * 2^-24 relative (~1e-5 for n ~ 1e6). Over a few AdamW steps that does not grow
  (measured on CPU, Llama hidden 256 x 4 layers, 8 steps: loss 1e-7, gradient norm 1e-6), so
  EXACT_RTOL = 1e-4 on each step's loss and gradient norm is 10x the bound, while a wrong
  gradient (a rank's slice lost, a sharding error) moves the loss by percents. The gradient norm
  is compared too because AdamW is scale-free: a sum where the mean belongs leaves the loss
  curve as it is but doubles the norm.
* paper: HOT's stochastic rounding makes the loss after N steps a random variable of the seed.
  The 1-rank final losses of n seeds give its mean m and standard deviation s; the 2-rank final
  loss is one more draw (each rank rounds its half with its own stream, and the all-reduce
  averages the two, which is the whole-batch rounding noise again). A normal draw lies within
  the prediction interval m +- t(0.995, n-1) * s * sqrt(1 + 1/n) with probability 0.99, so a
  FAIL is a 1% false alarm at most when HOT behaves; with 3 seeds t = 9.92, a wide interval.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from typing import Optional

EXACT_RTOL = 1e-4
# Two-sided 99% quantiles of Student's t with 1..10 degrees of freedom.
T995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169)


def _key(o) -> tuple:
    return (o.world, o.phase)


def _find(outcomes: dict, world: int, **spec):
    from .phases import Phase

    return outcomes.get((world, Phase(**spec)))


def _unfinished(*outs) -> Optional[str]:
    for o in outs:
        if o is None:
            return "a phase it needs was not planned"
        if o.status != "done":
            why = "; ".join(f"rank {r}: {m}" for r, m in sorted(o.errors.items()))
            return f"{o.phase.name} (world {o.world}) {o.status}: {why}"
    return None


def _rel(a: list, b: list) -> float:
    return max((abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b)), default=math.inf) \
        if len(a) == len(b) else math.inf


def _check(name: str, verdict: str, detail: str, **numbers) -> dict:
    return {"check": name, "verdict": verdict, "detail": detail, **numbers}


def exact_check(outcomes, wl: str, wrapper: str) -> dict:
    name = f"exact {wl} {wrapper}"
    ref = _find(outcomes, 1, kind="curve", workload=wl, wrapper="none", config="exact")
    got = _find(outcomes, 2, kind="curve", workload=wl, wrapper=wrapper, config="exact")
    why = _unfinished(ref, got)
    if why:
        return _check(name, "FAIL", f"did not run: {why}")
    a, b = ref.result, got.result
    rl, rg = _rel(a["losses"], b["losses"]), _rel(a["grad_norms"], b["grad_norms"])
    finite = all(math.isfinite(v) for v in a["losses"] + b["losses"])
    same_init = a["init_checksum"] == b["init_checksum"]
    ok = finite and same_init and rl <= EXACT_RTOL and rg <= EXACT_RTOL
    detail = (f"{len(a['losses'])} steps: max rel. diff of the loss {rl:.2e}, of the gradient "
              f"norm {rg:.2e} (tolerance {EXACT_RTOL:g}, float32 reduction order); loss "
              f"{b['losses'][-1]:.6f} (2 ranks) vs {a['losses'][-1]:.6f} (1 process)")
    if not same_init:
        detail += "; the initial weights differ between the runs"
    if not finite:
        detail += "; a loss is not finite"
    return _check(name, "PASS" if ok else "FAIL", detail, max_rel_loss=rl, max_rel_grad_norm=rg,
                  tolerance=EXACT_RTOL, losses_1=a["losses"], losses_2=b["losses"])


def paper_check(outcomes, wl: str, wrapper: str, seeds: tuple) -> dict:
    name = f"paper {wl} {wrapper}"
    ones = [_find(outcomes, 1, kind="curve", workload=wl, wrapper="none", seed=s)
            for s in seeds]
    two = _find(outcomes, 2, kind="curve", workload=wl, wrapper=wrapper, seed=seeds[0])
    why = _unfinished(*ones, two)
    if why:
        return _check(name, "FAIL", f"did not run: {why}")
    l1 = [o.result["losses"][-1] for o in ones]
    l2 = two.result["losses"][-1]
    n = len(l1)
    if not all(math.isfinite(v) for v in l1 + [l2]):
        return _check(name, "FAIL", f"a final loss is not finite: 1 rank {l1}, 2 ranks {l2}")
    if n < 2:
        return _check(name, "n/a", f"one seed gives no noise estimate: pass --seeds with 2+ "
                                   f"(1 rank {l1[0]:.4f}, 2 ranks {l2:.4f})")
    m = sum(l1) / n
    s = math.sqrt(sum((v - m) ** 2 for v in l1) / (n - 1))
    bound = T995[min(n - 1, len(T995)) - 1] * s * math.sqrt(1 + 1 / n)
    d = abs(l2 - m)
    steps = len(two.result["losses"])
    detail = (f"after {steps} steps: 2 ranks {l2:.4f}; 1 rank over seeds {list(seeds)}: "
              f"{', '.join(f'{v:.4f}' for v in l1)} (mean {m:.4f}, sd {s:.4f}, spread "
              f"{max(l1) - min(l1):.4f}); difference {d:.4f}, 99% bound {bound:.4f}")
    return _check(name, "PASS" if d <= bound else "FAIL", detail, loss_2=l2, losses_1=l1,
                  mean_1=m, sd_1=s, bound=bound)


def _lqs_of(states: list) -> list:
    return [s[0] for s in states]


def lqs_check(outcomes, wl: str, wrapper: str, seed: int) -> dict:
    name = f"lqs {wl} {wrapper}"
    o = _find(outcomes, 2, kind="curve", workload=wl, wrapper=wrapper, seed=seed)
    why = _unfinished(o)
    if why:
        return _check(name, "FAIL", f"did not run: {why}")
    ranks = o.result["layer_states"]
    decisions = [_lqs_of(r) for r in ranks]
    same = all(d == decisions[0] for d in decisions)
    mirrors = all(s[0] == s[1] and s[2] == s[3] for r in ranks for s in r)
    d0 = decisions[0]
    undecided = d0.count(-1)
    ok = same and mirrors and undecided == 0
    detail = (f"{len(d0)} HOT layers: {d0.count(1)} per-token, {d0.count(0)} per-tensor, "
              f"{undecided} undecided; {'identical' if same else 'DIFFERENT'} on "
              f"{len(ranks)} ranks" + ("" if mirrors else "; a Python mirror differs from its "
                                                         "buffer"))
    return _check(name, "PASS" if ok else "FAIL", detail, decisions=decisions)


def checkpoint_check(outcomes, wl: str, wrapper: str) -> dict:
    name = f"checkpoint {wl} {wrapper}"
    o = _find(outcomes, 2, kind="checkpoint", workload=wl, wrapper=wrapper, config="paper")
    why = _unfinished(o)
    if why:
        return _check(name, "FAIL", f"did not run: {why}")
    problems = []
    for r, st in enumerate(o.result["ranks"]):
        if st["after"] != st["before"]:
            problems.append(f"rank {r}: state after loading differs from the saved one")
        if any(s[0] != -1 or s[2] != 0 for s in st["fresh"]):
            problems.append(f"rank {r}: the fresh model was not undecided (the check would "
                            f"prove nothing)")
        if st["params_after"] != st["params_before"]:
            problems.append(f"rank {r}: parameters differ after loading")
        if any(a[0] != b[0] or a[2] + 1 != b[2] or b[1] != b[0] or b[3] != b[2]
               for a, b in zip(st["before"], st["resumed"])):
            problems.append(f"rank {r}: the step after loading recalibrated or miscounted")
    st = o.result["ranks"][0]
    lqs = _lqs_of(st["before"])
    detail = (f"saved after {o.result['steps_before_save']} steps: {len(lqs)} layers "
              f"({lqs.count(1)} per-token, {lqs.count(0)} per-tensor, step "
              f"{st['before'][0][2]}); " + ("restored on every rank, and the next step kept "
                                            "the decisions" if not problems else
                                            "; ".join(problems)))
    return _check(name, "FAIL" if problems else "PASS", detail)


def poison_check(outcomes, wl: str, case: str) -> dict:
    name = f"{case}_gy {wl} ddp"
    o = _find(outcomes, 2, kind="poison", workload=wl, wrapper="ddp", case=case)
    what = ("rank 1's loss times 0 (all-zero g_y)" if case == "zero" else
            "a NaN in one HOT layer's g_y on rank 1")
    why = _unfinished(o)
    if why:
        return _check(name, "FAIL", f"{what} during LQS calibration: {why} (a known cause: a "
                                    f"rank that skips LQS's all-reduce while the others wait "
                                    f"in it, hot/nn/state.py)")
    res = o.result
    problems = [] if res["undecided_at_start"] else ["LQS had decided before the step"]
    walls = []
    for k in ("step0", "step1"):
        ranks = res[k]
        walls.append(max(r["wall_s"] for r in ranks))
        # The decisions, buffer and Python mirror: DDP broadcasts rank 0's buffers in forward,
        # which would hide a rank whose mirror (what backward reads) went its own way.
        d = [[s[:2] for s in r["layer_states"]] for r in ranks]
        if any(x != d[0] for x in d):
            problems.append(f"after {k} the LQS decisions differ between ranks: {d}")
        if any(a != b for r in d for a, b in r):
            problems.append(f"after {k} an LQS buffer differs from its Python mirror")
    d = _lqs_of(res["step1"][0]["layer_states"])
    skipped = not res["step0"][0]["stepped"]
    detail = (f"{what} during LQS calibration (layer {res['layer']}): both steps ended on every "
              f"rank ({walls[0]:.2f} s, {walls[1]:.2f} s); decisions after them: "
              f"{d.count(1)} per-token, {d.count(0)} per-tensor, {d.count(-1)} undecided"
              + ("; the optimizer skipped the non-finite step" if skipped else ""))
    if problems:
        detail += "; " + "; ".join(problems)
    return _check(name, "FAIL" if problems else "PASS", detail, step_wall_s=walls)


def all_checks(outcomes: dict, opts) -> list[dict]:
    both = 1 in opts.worlds and 2 in opts.worlds
    todo = []
    for wl in opts.workloads:
        for wrapper in opts.wrappers:
            if "exact" in opts.checks and both:
                todo.append((f"exact {wl} {wrapper}", exact_check, (wl, wrapper)))
            if "paper" in opts.checks and both:
                todo.append((f"paper {wl} {wrapper}", paper_check, (wl, wrapper, opts.seeds)))
            if "lqs" in opts.checks and 2 in opts.worlds:
                todo.append((f"lqs {wl} {wrapper}", lqs_check, (wl, wrapper, opts.seeds[0])))
            if "checkpoint" in opts.checks and 2 in opts.worlds:
                todo.append((f"checkpoint {wl} {wrapper}", checkpoint_check, (wl, wrapper)))
    for case in ("zero", "nan"):
        if f"{case}_gy" in opts.checks and 2 in opts.worlds:
            todo.append((f"{case}_gy {opts.workloads[0]} ddp", poison_check,
                         (opts.workloads[0], case)))
    out = []
    for name, fn, args in todo:
        try:
            out.append(fn(outcomes, *args))
        except Exception as e:  # a result of an unexpected shape: this check only fails
            out.append(_check(name, "FAIL", f"the check itself failed: {type(e).__name__}: {e}"))
    return out


def speed_rows(outcomes: dict, opts) -> list[dict]:
    if not opts.speed:
        return []
    rows = []
    for wl in opts.workloads:
        for method in opts.methods:
            for wrapper in opts.wrappers:
                by_world = {w: _find(outcomes, w, kind="speed", workload=wl, wrapper=wrapper,
                                     method=method) for w in opts.worlds}
                for w, o in by_world.items():
                    row = {"workload": wl, "method": method, "wrapper": wrapper, "world": w,
                           "status": o.status if o else "not planned"}
                    if o and o.status == "done":
                        r = o.result
                        peaks = [x["peak_bytes"] for x in r["ranks"]]
                        row.update(step_ms=r["step_ms"], throughput=r["throughput"],
                                   unit=r["unit"], peak_GiB=[p / 2**30 if p is not None
                                                             else None for p in peaks])
                        one = by_world.get(1)
                        if w == 2 and one and one.status == "done":
                            row["scaling"] = r["throughput"] / (2 * one.result["throughput"])
                    rows.append(row)
    return rows


def interconnect() -> tuple[Optional[str], Optional[str]]:
    """(GPU0-GPU1 link as `nvidia-smi topo -m` names it, the whole matrix), or Nones."""
    try:
        text = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                              timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return link_of(text), text or None


def link_of(topology: str) -> Optional[str]:
    """The GPU0 row's GPU1 cell of a `nvidia-smi topo -m` matrix (e.g. 'NV18'), or None."""
    rows = [line.split() for line in topology.splitlines() if line.strip()]
    if not rows or "GPU1" not in rows[0]:
        return None
    col = rows[0].index("GPU1") + 1  # data rows start with their own name
    return next((r[col] for r in rows[1:] if r[0] == "GPU0" and len(r) > col), None)


def _short(text: str, n: int = 400) -> str:
    """A table cell: one line, at most n characters (the JSON file has the whole text)."""
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= n else text[:n - 3] + "..."


def markdown(result: dict) -> str:
    env, w = result.get("env", {}), result.get("env", {}).get("worker") or {}
    if w.get("device") == "cuda":
        dev = (f"{w.get('gpus')}x {w.get('gpu')} (sm {w.get('sm')}), GPU0-GPU1 link: "
               f"{env.get('link') or 'n/a'} (nvidia-smi topo -m); torch {w.get('torch')}, CUDA "
               f"{w.get('cuda')}, NCCL {w.get('nccl')}, triton {w.get('triton')}; HOT fast "
               f"backend (native backward: {w.get('native')})")
    else:
        dev = (f"CPU ({w.get('cpu', '?')}), gloo; torch {w.get('torch', '?')}; HOT reference "
               f"backend")
    data = "; ".join(f"{k}: {v}" for k, v in sorted(result.get("data", {}).items()))
    lines = ["## HOT under DDP / FSDP2", "", dev + (f". Data: {data}." if data else ""), ""]
    lines += ["| check | verdict | numbers |", "|---|---|---|"]
    lines += [f"| {c['check']} | {c['verdict']} | {_short(c['detail'])} |"
              for c in result["checks"]]
    rows = result["speed"]
    if rows:
        lines += ["", "| workload | method | wrapper | GPUs | step ms | throughput | scaling "
                  "| peak GiB per GPU |", "|---|---|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            if "step_ms" not in r:
                lines.append(f"| {r['workload']} | {r['method']} | {r['wrapper']} | "
                             f"{r['world']} | {r['status']} | | | |")
                continue
            peak = "/".join(f"{p:.2f}" for p in r["peak_GiB"] if p is not None) or "n/a"
            sc = f"{r['scaling']:.2f}" if "scaling" in r else ""
            lines.append(f"| {r['workload']} | {r['method']} | {r['wrapper']} | {r['world']} | "
                         f"{r['step_ms']:.2f} | {r['throughput']:,.0f} {r['unit']}/s | {sc} | "
                         f"{peak} |")
        if w.get("device") != "cuda":
            lines += ["", "(CPU: wall-clock times of tiny models, not a benchmark.)"]
    else:
        lines += ["", result.get("speed_note", "")]
    return "\n".join(lines)


def write_json(path: str, result: dict) -> None:
    from hot.analysis.records import finite

    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(finite(result), f, indent=1, default=str)
    os.replace(tmp, path)
