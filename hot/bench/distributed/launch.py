"""The launcher: plans the blocks of phases, runs each block in fresh worker processes (one per
rank; rank r on GPU r), follows their record files, and starts a block again at the next phase
when a phase fails, so that one failure or hang costs that phase only.

Blocks, in order: world 1 (rank 0 alone: the 1-process reference curves and the 1-GPU timings),
world 2 (the 2-rank curves, checkpoints and timings), then one block per g_y poisoning case
(zero, NaN), each in processes of its own because a hang there must not take the others down.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Optional

from . import worker
from .phases import Phase

GRACE_S = 3.0  # how long the peers of a failed rank get to record their own state


@dataclass
class Block:
    label: str
    world: int
    phases: list


@dataclass
class Outcome:
    """What became of one phase: status 'done', 'error', 'timeout', 'killed' or 'skipped'."""

    block: str
    world: int
    phase: Phase
    status: str = "killed"
    result: Optional[dict] = None
    errors: dict = field(default_factory=dict)  # rank -> message
    wall_s: Optional[float] = None

    def to_dict(self) -> dict:
        return {"block": self.block, "world": self.world, "phase": self.phase.name,
                "spec": self.phase.__dict__, "status": self.status, "wall_s": self.wall_s,
                "errors": {str(k): v for k, v in self.errors.items()}, "result": self.result}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan(opts) -> list[Block]:
    hot_paper = lambda wl, wrapper, seed: Phase("curve", wl, wrapper, "hot", "paper", seed)
    both = 1 in opts.worlds and 2 in opts.worlds
    speed = [(wl, wrapper, m) for wl in opts.workloads for wrapper in opts.wrappers
             for m in opts.methods] if opts.speed else []
    blocks = []
    if 1 in opts.worlds:
        ph = []
        for wl in opts.workloads:
            if "exact" in opts.checks and both:
                ph.append(Phase("curve", wl, "none", "hot", "exact"))
            if "paper" in opts.checks and both:
                ph += [hot_paper(wl, "none", s) for s in opts.seeds]
        ph += [Phase("speed", wl, wrapper, m) for wl, wrapper, m in speed]
        blocks.append(Block("world 1", 1, ph))
    if 2 in opts.worlds:
        ph = []
        for wl in opts.workloads:
            for wrapper in opts.wrappers:
                if "exact" in opts.checks and both:
                    ph.append(Phase("curve", wl, wrapper, "hot", "exact"))
                if ("paper" in opts.checks and both) or "lqs" in opts.checks:
                    ph.append(hot_paper(wl, wrapper, opts.seeds[0]))
                if "checkpoint" in opts.checks:
                    ph.append(Phase("checkpoint", wl, wrapper))
        ph += [Phase("speed", wl, wrapper, m) for wl, wrapper, m in speed]
        blocks.append(Block("world 2", 2, ph))
        for case in ("zero", "nan"):
            if f"{case}_gy" in opts.checks:
                blocks.append(Block(f"{case} g_y", 2, [
                    Phase("poison", opts.workloads[0], "ddp", case=case)]))
    return [b for b in blocks if b.phases]


def summary(ph: Phase, res: dict) -> str:
    """One line of a finished phase's numbers."""
    if ph.kind == "curve":
        ls = res["losses"]
        return f"loss {ls[0]:.4f} -> {ls[-1]:.4f} in {len(ls)} steps"
    if ph.kind == "speed":
        peaks = [r["peak_bytes"] for r in res["ranks"] if r["peak_bytes"] is not None]
        mem = f", peak {max(peaks) / 2**30:.2f} GiB/GPU" if peaks else ""
        return f"{res['step_ms']:.2f} ms/step, {res['throughput']:.0f} {res['unit']}/s{mem}"
    if ph.kind == "poison":
        walls = [max(r["wall_s"] for r in res[k]) for k in ("step0", "step1") if k in res]
        return "steps took " + ", ".join(f"{w:.2f} s" for w in walls)
    return "saved, rebuilt, loaded"


def _ended(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"process ended by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"process ended with status {code}"


class _Reader:
    """The new whole lines of a record file."""

    def __init__(self, path: str):
        self.path, self.pos = path, 0

    def new(self) -> list[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.pos += end
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()]


class _Attempt:
    """The events of one start of a block's processes, by phase and rank."""

    def __init__(self, world: int):
        self.world = world
        self.ready: set = set()
        self.env: Optional[dict] = None
        self.by_phase: dict = {}
        self.init_errors: dict = {}
        self.notes: list = []

    def add(self, rank: int, e: dict) -> None:
        ev, i = e["event"], e["phase"]
        if ev == "ready":
            self.ready.add(rank)
            self.env = e.get("env") or self.env
        elif ev == "note":
            self.notes.append(e["text"])
        elif i < 0 and ev in ("error", "timeout"):
            self.init_errors[rank] = e["error"]
        elif i >= 0:
            self.by_phase.setdefault(i, {}).setdefault(ev, {})[rank] = e

    def finished(self, i: int) -> bool:
        return len(self.by_phase.get(i, {}).get("done", {})) == self.world

    def failure(self, i: int) -> Optional[tuple[str, dict]]:
        ev = self.by_phase.get(i, {})
        for status in ("timeout", "error", "skipped"):
            if ev.get(status):
                return status, {r: e.get("error", status) for r, e in ev[status].items()}
        return None


def run_block(block: Block, opts, outdir: str, deadline: float, say, env: dict) -> list:
    """Outcomes of the block's phases, in order."""
    import torch.multiprocessing as mp

    spawn = mp.get_context("spawn")
    out = [Outcome(block.label, block.world, ph) for ph in block.phases]
    start, attempt = 0, 0
    while start < len(block.phases):
        if time.time() > deadline - 5:
            for o in out[start:]:
                o.status, o.errors = "skipped", {0: "the run's time budget (--budget) is spent"}
            say(f"skip  {block.label}: {len(out) - start} phase(s), the time budget is spent")
            break
        attempt += 1
        tag = f"{block.label.replace(' ', '_')}.{attempt}"
        port = free_port()
        procs = [spawn.Process(target=worker.main, args=(r, block.world, port, block.phases,
                                                         start, opts, outdir, tag, deadline))
                 for r in range(block.world)]
        for p in procs:
            p.start()
        readers = [_Reader(os.path.join(outdir, f"{tag}.rank{r}.jsonl"))
                   for r in range(block.world)]
        at = _Attempt(block.world)
        said: set = set()
        last, failed_at, killed = time.time(), None, None

        def follow():
            nonlocal last
            for r, rd in enumerate(readers):
                for e in rd.new():
                    last = time.time()
                    at.add(r, e)
            for n in at.notes:
                if n not in env.setdefault("notes", []):
                    env["notes"].append(n)
                    say(n)
            if at.env and "worker" not in env:
                env["worker"] = at.env
            for i in sorted(at.by_phase):
                if i in said:
                    continue
                ph = block.phases[i]
                if at.finished(i):
                    said.add(i)
                    d = at.by_phase[i]["done"]
                    say(f"ok    {block.label}: {ph.name} ({d[0]['wall_s']:.1f} s): "
                        f"{summary(ph, d[0]['result'])}")
                elif at.failure(i):
                    said.add(i)
                    status, errs = at.failure(i)
                    for r, msg in sorted(errs.items()):
                        say(f"FAIL  {block.label}: {ph.name}: {status} on rank {r}: {msg}")

        while True:
            follow()
            codes = [p.exitcode for p in procs]
            now = time.time()
            if all(c is not None for c in codes):
                break
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = now
            # A rank that failed leaves its peers waiting in a collective: end them soon.
            quiet = now - last > opts.phase_timeout + 60
            if (failed_at and now - failed_at > GRACE_S) or quiet or now > deadline + 20:
                killed = killed or ("no record for a while" if quiet else
                                    "the time budget is spent" if now > deadline + 20 else
                                    "a peer rank had failed")
                for p in procs:
                    if p.exitcode is None:
                        p.terminate()
                time.sleep(GRACE_S)
                for p in procs:
                    if p.exitcode is None:
                        p.kill()
                for p in procs:
                    p.join(10)
                break
            time.sleep(0.2)
        follow()
        codes = [p.exitcode for p in procs]
        nxt = None
        for i in range(start, len(block.phases)):
            o = out[i]
            if at.finished(i):
                d = at.by_phase[i]["done"]
                o.status, o.result, o.wall_s = "done", d[0]["result"], d[0]["wall_s"]
                continue
            f = at.failure(i)
            if f:
                o.status, o.errors = f
                # A rank that died without a word (a C++ abort, a signal) says so by its status.
                o.errors.update({r: _ended(c) for r, c in enumerate(codes)
                                 if r not in o.errors and c not in (0, None)})
            elif not at.ready:
                o.status = "error"
                o.errors = at.init_errors or {
                    r: _ended(c) + " before joining the process group"
                    for r, c in enumerate(codes)}
            else:
                o.status = "killed"
                o.errors = {r: _ended(c) + (f" ({killed})" if killed else "")
                            for r, c in enumerate(codes) if c != 0}
                if i not in said:
                    say(f"FAIL  {block.label}: {block.phases[i].name}: killed: {o.errors}")
            if o.status == "skipped":
                for o2 in out[i + 1:]:
                    o2.status, o2.errors = o.status, o.errors
                nxt = len(block.phases)
            elif not at.ready:
                # The processes never got going: starting them again would fail alike.
                for o2 in out[i + 1:]:
                    o2.status, o2.errors = "error", {0: "not run: the block's processes failed "
                                                        "to start"}
                say(f"FAIL  {block.label}: the processes did not start: {o.errors}")
                nxt = len(block.phases)
            else:
                nxt = i + 1
            break
        if nxt is None:
            break
        start = nxt
    return out
