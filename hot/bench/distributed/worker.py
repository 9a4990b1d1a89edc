"""One worker process: joins the process group of its block, runs the block's phases in order
under a wall-clock watchdog, and appends what happened to its record file (one JSON line per
event), which the launcher reads while it runs.

A phase that raises ends the process at once (its peers may wait in a collective it will never
join; the launcher ends them and starts the block again at the next phase). A phase that outruns
its time limit is ended by the watchdog, which first records the timeout and dumps every
thread's stack to stderr.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import json
import os
import sys
import threading
import time
import traceback
from typing import Optional

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
EXIT_ERROR, EXIT_TIMEOUT = 1, 124


class Recorder:
    """Appends one JSON line per event to ``path``; each line is one write(2), so a process
    ended at any moment leaves only whole lines."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, event: str, phase: int = -1, **kw) -> None:
        line = json.dumps({"event": event, "phase": phase, "t": time.time(), **kw},
                          default=str) + "\n"
        os.write(self.fd, line.encode())


class Watchdog:
    """Ends the process when the armed deadline passes, after recording why."""

    def __init__(self, rec: Recorder):
        self.rec = rec
        self.cond = threading.Condition()
        self.deadline: Optional[float] = None
        self.label, self.phase, self.limit = "", -1, 0.0
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self, seconds: Optional[float], label: str, phase: int) -> None:
        with self.cond:
            self.deadline = None if seconds is None else time.time() + seconds
            self.label, self.phase, self.limit = label, phase, seconds or 0.0
            self.cond.notify()

    def _run(self) -> None:
        with self.cond:
            while self.deadline is None or time.time() < self.deadline:
                self.cond.wait(None if self.deadline is None else self.deadline - time.time())
            self.rec.write("timeout", self.phase, error=f"{self.label}: not finished after "
                                                        f"{self.limit:g} s")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(EXIT_TIMEOUT)


class Context:
    """What a phase sees: its rank and device, the options, the workloads (built once per
    process), a device mesh over the whole group, a scratch folder, and ``arm`` to set the
    watchdog's limit for part of a phase (None: back to the phase's own limit)."""

    def __init__(self, rank, world, device, opts, tmpdir, rec, dog):
        self.rank, self.world, self.device, self.opts = rank, world, device, opts
        self.tmpdir, self.rec, self.dog = tmpdir, rec, dog
        self._workloads: dict = {}
        self._mesh = None
        self.phase, self.phase_limit, self.phase_label = -1, None, ""
        self._notes: set = set()

    def log(self, msg: str) -> None:
        if self.rank == 0 and msg not in self._notes:
            self._notes.add(msg)
            self.rec.write("note", self.phase, text=msg)

    def workload(self, name: str):
        from . import workloads

        if name not in self._workloads:
            self._workloads[name] = workloads.make(name, self.opts, self.log)
        return self._workloads[name]

    def mesh(self):
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(self.device.type, (self.world,))
        return self._mesh

    def arm(self, seconds: Optional[float], label: str) -> None:
        if seconds is None:
            self.dog.arm(self.phase_limit, self.phase_label, self.phase)
        else:
            self.dog.arm(seconds, label, self.phase)


def env_info(device) -> dict:
    import platform

    import torch

    out = {"torch": torch.__version__, "python": platform.python_version(),
           "device": device.type}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        nccl = torch.cuda.nccl.version()
        out.update(gpu=p.name, sm=f"{p.major}.{p.minor}", gpus=torch.cuda.device_count(),
                   cuda=torch.version.cuda,
                   nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
        try:  # a fast backend that cannot load fails the HOT phases, each saying why
            import triton

            from hot.fast import native

            out.update(triton=triton.__version__, native=native.why_off() or "on")
        except Exception as e:
            out.update(triton=None, native=f"fast backend unavailable: {type(e).__name__}: {e}")
    else:
        out.update(cpu=platform.processor() or platform.machine(), nccl=None)
    return out


def main(rank: int, world: int, port: int, phases: list, start: int, opts, outdir: str,
         tag: str, deadline: float) -> None:
    """Run ``phases[start:]`` as rank ``rank`` of ``world`` (process group on 127.0.0.1:port);
    records go to ``outdir/<tag>.rank<rank>.jsonl``; nothing starts after ``deadline``."""
    for k, v in NCCL_ENV.items():
        os.environ.setdefault(k, v)
    faulthandler.enable(all_threads=True)
    rec = Recorder(os.path.join(outdir, f"{tag}.rank{rank}.jsonl"))
    dog = Watchdog(rec)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(opts.threads)
        # float32 means float32 (the exact check's tolerance is float32's): no TF32 matmuls.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if opts.device == "cuda":
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        dog.arm(opts.pg_timeout + 30, "joining the process group", -1)
        timeout = datetime.timedelta(seconds=opts.pg_timeout)
        # An explicit store, rank 0 its server: a tcp:// or env:// rendezvous would heed the
        # TORCHELASTIC_* variables that torchrun left to the launcher (some torch versions then
        # make every rank a client of a server nobody runs).
        store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=timeout)
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
            world_size=world, timeout=timeout,
            device_id=device if device.type == "cuda" else None)
        dist.barrier()
        dog.arm(None, "", -1)
        rec.write("ready", env=env_info(device) if rank == 0 else None)
        ctx = Context(rank, world, device, opts, outdir, rec, dog)
        from .phases import PHASES

        for i in range(start, len(phases)):
            ph = phases[i]
            # Every rank takes the same decision: start the phase only if time is left.
            left = torch.tensor([deadline - time.time()], device=device)
            dist.all_reduce(left, op=dist.ReduceOp.MIN)
            if float(left) < 5:
                rec.write("skipped", i, error="the run's time budget (--budget) is spent")
                continue
            ctx.phase, ctx.phase_label = i, ph.name
            ctx.phase_limit = min(opts.phase_timeout, float(left))
            rec.write("start", i)
            ctx.arm(None, "")
            t0 = time.time()
            try:
                res = PHASES[ph.kind](ctx, ph)
            except Exception as e:
                rec.write("error", i, error=f"{type(e).__name__}: {e}",
                          trace=traceback.format_exc()[-4000:])
                traceback.print_exc()
                os._exit(EXIT_ERROR)
            dog.arm(None, "", i)
            rec.write("done", i, wall_s=time.time() - t0, result=res if rank == 0 else None)
            res = None
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        dog.arm(20, "leaving the process group", -1)
        dist.barrier()
        dist.destroy_process_group()
        rec.write("exit")
    except Exception as e:
        rec.write("error", -1, error=f"{type(e).__name__}: {e}",
                  trace=traceback.format_exc()[-4000:])
        traceback.print_exc()
        os._exit(EXIT_ERROR)
    # Everything is recorded: skip the interpreter's teardown (seconds of module and thread
    # cleanup per process).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
