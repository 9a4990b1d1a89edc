"""``python -m hot.bench.distributed``: parse the options, run the blocks, report."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from typing import Optional

from ..argparser import UsageErrorFactory
from . import launch, report
from .options import OptionsError, from_args
from .worker import NCCL_ENV


def _torchrun_rank() -> int:
    """This process's rank when torchrun started it, else 0."""
    if "TORCHELASTIC_RUN_ID" not in os.environ and "LOCAL_RANK" not in os.environ:
        return 0
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def run(opts, say=None) -> dict:
    """Run every planned block and return the results (also written to opts.json)."""
    t0 = time.time()
    say = say or (lambda m: print(f"[{time.time() - t0:5.0f} s] {m}", flush=True))
    deadline = t0 + opts.budget
    for k, v in NCCL_ENV.items():
        os.environ.setdefault(k, v)
    # Read by each worker's OpenMP at import: torchrun's default is 1 thread per process.
    os.environ["OMP_NUM_THREADS"] = str(opts.threads)
    if opts.device == "cpu" and os.path.isdir("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo over loopback only
    link, topo = report.interconnect() if opts.device == "cuda" else (None, None)
    result = {"options": opts.to_dict(), "env": {"link": link, "topology": topo},
              "phases": [], "checks": [], "speed": []}
    blocks = launch.plan(opts)
    if opts.device == "cuda":
        import torch

        have = torch.cuda.device_count()
        for b in [b for b in blocks if b.world > have]:
            say(f"skip  {b.label}: needs {b.world} GPUs, {have} visible")
            blocks.remove(b)
    if not opts.speed:
        result["speed_note"] = ("Speed and memory not measured: " +
                                ("on CPU they mean nothing (pass --speed to run them anyway)."
                                 if opts.device == "cpu" else "--no-speed."))
        say(result["speed_note"])
    say("plan: " + "; ".join(f"{b.label}: {len(b.phases)} phases" for b in blocks)
        + f"; budget {opts.budget:.0f} s; results to {opts.json}")
    outcomes = {}
    outdir = tempfile.mkdtemp(prefix="hot-distributed-")
    try:
        for b in blocks:
            try:
                done = launch.run_block(b, opts, outdir, deadline, say, result["env"])
            except Exception as e:  # the launcher's own failure: reported, the next block runs
                say(f"FAIL  {b.label}: the launcher failed: {type(e).__name__}: {e}")
                done = [launch.Outcome(b.label, b.world, ph, "error",
                                       errors={0: f"launcher: {type(e).__name__}: {e}"})
                        for ph in b.phases]
            for o in done:
                outcomes[(o.world, o.phase)] = o
                result["phases"].append(o.to_dict())
            report.write_json(opts.json, result)
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    result["data"] = {o.phase.workload: o.result["data"] for o in outcomes.values()
                      if o.status == "done" and "data" in (o.result or {})}
    result["checks"] = report.all_checks(outcomes, opts)
    result["speed"] = report.speed_rows(outcomes, opts)
    result["wall_s"] = time.time() - t0
    for c in result["checks"]:
        say(f"{c['verdict']:4}  {c['check']}: {c['detail']}")
    report.write_json(opts.json, result)
    say(f"results: {opts.json} ({result['wall_s']:.0f} s in all)")
    print("\n" + report.markdown(result), flush=True)
    return result


def main(argv=None, usage_error: Optional[UsageErrorFactory] = None) -> int:
    rank = _torchrun_rank()
    if rank != 0:
        print(f"rank {rank}: idle; under torchrun, rank 0 starts the benchmark's own processes "
              f"(one per GPU), so that a phase that hangs can be ended and the run goes on.",
              flush=True)
        return 0
    try:
        opts = from_args(argv, usage_error)
    except OptionsError as e:
        if usage_error is not None:  # under the hot command: its one-line usage error
            raise usage_error(str(e)) from None
        print(f"error: {e}", file=sys.stderr)
        return 2
    run(opts)
    return 0
