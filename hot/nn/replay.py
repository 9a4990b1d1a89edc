"""x's delayed HLA history when a forward runs again: activation checkpointing.

Under HLAConfig(amax="delayed") a forward that forms x's ABC codes reads the layer's x history
(hot.nn.state.hla_history) and overwrites it with this pass's channel absmax. Non-reentrant
activation checkpointing (torch.utils.checkpoint(..., use_reentrant=False)) drops what the
forward kept and runs the forward again inside backward. That second run must form the codes
the first one formed, so it must read the history the first one read, not the one it left, and
it must leave the history alone (later forwards of the layer may have written it since).

PyTorch gives no public signal that a forward is such a re-run, so:

* a forward that runs outside a backward records copies of the history it read and of the one
  it wrote (``XPass``). The call's autograd node holds the record, this module holds it weakly:
  it lives exactly as long as the graph whose backward may run the forward again;
* a forward that runs while this thread executes a backward (the autograd engine's graph task,
  by which torch.utils.checkpoint itself keys its re-runs) and finds a record of the layer whose
  backward has not run yet and that this backward has not re-run is a re-run: it forms the codes
  with a copy of that record's history and leaves the layer's history as it is;
* one that finds none runs as a first forward. Reentrant checkpointing runs the first forward
  under no_grad, where a HOT layer runs the plain op and keeps no history: its forward inside
  backward is the layer's one HOT forward, which reads and writes the history as usual.

Where several records qualify (a layer applied more than once per step: shared weights, in one
checkpointed region or in several), the re-run's own channel absmax names its call: it equals
what that call wrote. The check costs one more quantizer pass and a host sync, only then.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import weakref
from typing import Optional

import torch

from .backward import abc_codes
from .state import LayerPlan

_ORDER = itertools.count()
# Per layer, weak references to the records of its forwards (outside the layer, so that copying
# or pickling a layer neither copies them nor fails on them).
_RECORDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# The record the forward operator just made, for the autograd Function that called it to hold.
_LAST = threading.local()


class XPass:
    """What one forward's x pass read and wrote of the layer's delayed x history."""

    __slots__ = ("read", "wrote", "order", "step", "task", "done", "rerun_in", "__weakref__")

    def __init__(self, read: torch.Tensor, step: int, task: int):
        self.read, self.wrote = read, None
        self.order, self.step = next(_ORDER), step
        self.task = task  # the graph task the forward ran in (-1: none)
        self.done = False  # the call's backward has run
        self.rerun_in: set = set()  # graph tasks in which the forward ran again


def _graph_task() -> int:
    """The backward (graph task) this thread executes, -1 outside any."""
    return torch._C._current_graph_task_id()


def delayed_x_codes(layer, plan: LayerPlan, rows: torch.Tensor):
    """abc_codes(plan, rows) for a plan with a delayed x history (plan.x_hist), as the layer's
    first forward of this call formed them (module docstring)."""
    task = _graph_task()
    if task != -1:
        rec = _rerun_of(layer, plan, rows, task)
        if rec is not None:
            rec.rerun_in.add(task)
            # a copy: the quantizer writes this pass's absmax into the history it is given
            return abc_codes(dataclasses.replace(plan, x_hist=rec.read.clone()), rows)
    rec = XPass(plan.x_hist.clone(), layer.hot_step_value(), task)
    out = abc_codes(plan, rows)
    rec.wrote = plan.x_hist.clone()
    refs = [r for r in _RECORDS.get(layer, ()) if r() is not None]
    refs.append(weakref.ref(rec))
    _RECORDS[layer] = refs
    _LAST.rec = rec
    return out


def take_last() -> Optional[XPass]:
    """The record of the forward operator that just ran on this thread (None if it made none),
    for its autograd node to hold; cleared."""
    rec = getattr(_LAST, "rec", None)
    _LAST.rec = None
    return rec


def _rerun_of(layer, plan: LayerPlan, rows: torch.Tensor, task: int) -> Optional[XPass]:
    recs = [r() for r in _RECORDS.get(layer, ())]
    # Not a forward this same backward ran first (reentrant checkpointing: a layer applied twice
    # in one region runs both calls inside the backward).
    cands = [r for r in recs if r is not None and not r.done and task not in r.rerun_in
             and r.task != task and r.read.device == plan.x_hist.device]
    if len(cands) <= 1:
        return cands[0] if cands else None
    # Several forwards of the layer await their backward: the re-run's channel absmax is what
    # its first run wrote.
    probe = torch.zeros_like(plan.x_hist)
    abc_codes(dataclasses.replace(plan, x_hist=probe), rows)
    same = [r for r in cands if torch.equal(r.wrote, probe)]
    # Latest step first (older graphs may still be alive), then in forward order.
    return min(same or cands, key=lambda r: (-r.step, r.order))
