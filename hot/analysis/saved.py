"""Measure the bytes autograd keeps for backward, per layer, with saved-tensor hooks.

Every tensor that autograd saves during a forward passes through the pack hook of
``torch.autograd.graph.saved_tensors_hooks``. We attribute it to the innermost nn.Linear /
nn.Conv2d whose forward is running (forward pre/post hooks keep a stack), or to '<other>'
(norms, activations, attention, losses). A storage is counted once however many tensors
(views, repeated saves) point into it, and at its full size; a storage saved both by a layer
and by another op is charged to the layer (the layer alone would keep it alive). Parameters are excluded: they
exist whether or not anything is saved; a cast copy of a weight (autocast) is not a Parameter
and is counted.

``SavedTensorMeter.label`` and ``listing`` say what each counted storage is: the autograd node
that keeps it (eagerly), or, for a torch.compile graph's saved tensors, the op that made it and
the modules whose backward reads it (``CompiledSavedCapture``, from Inductor's partitioner).
"""

from __future__ import annotations

import contextlib
import operator
import re
from collections import OrderedDict, defaultdict

import torch
import torch.nn as nn

OTHER = "<other>"


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr()), s.nbytes()


def _plain(t: torch.Tensor) -> list:
    """The plain tensors holding ``t``'s data: t itself, or a tensor subclass's inner tensors
    (torchao's float8 tensors: the float8 data and its scale), whose storages are what memory
    holds (the wrapper has none)."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if type(t) is torch.Tensor or type(t) is nn.Parameter or flatten is None:
        return [t]
    names, _ = flatten()
    return [x for n in names for x in _plain(getattr(t, n))]


class SavedTensorMeter:
    """Context manager: ``with SavedTensorMeter(model) as m: loss = f(model(x))``; then
    ``m.by_layer`` = {layer fqn: bytes}, ``m.total`` = all bytes saved, ``m.layer_total`` =
    bytes attributed to Linear/Conv2d layers. Keep the graph alive (do not call backward)
    inside the block if you also want ``live_bytes`` to be the peak; counting is unaffected."""

    def __init__(self, model: nn.Module, layer_types=(nn.Linear, nn.Conv2d),
                 track_modules: bool = False):
        self.model = model
        # track_modules: note the innermost module of every save (eager runs; a compiled graph
        # saves at its end, so there ``label`` names the module from the graph instead)
        self.track_modules = track_modules
        self.layer_types = layer_types
        self.by_layer: "OrderedDict[str, int]" = OrderedDict()
        self.dtypes: dict[str, set] = {}
        self._owner: dict = {}  # storage key -> where it is charged
        self._stack: list[str] = []
        self._handles: list = []
        self._params = {_storage_key(p)[0] for p in model.parameters()}
        # the device type of the model's parameters: saves elsewhere (HLAConfig(abc="offload")'s
        # codes in host memory) are reported apart by by_dtype
        first = next(iter(model.parameters()), None)
        self._home = first.device.type if first is not None else None
        self._hooks_ctx = None
        # storage key -> [nbytes, shape, dtype, innermost module]: what ``listing`` reports
        self.records: "OrderedDict[tuple, list]" = OrderedDict()
        self._mods: list[str] = []

    def _pack(self, t: torch.Tensor):
        for inner in _plain(t):
            self._count(inner)
        return t

    def _count(self, t: torch.Tensor) -> None:
        key, nbytes = _storage_key(t)
        if key in self._params:
            return
        where = self._stack[-1] if self._stack else OTHER
        owner = self._owner.get(key)
        if owner is not None:
            if owner == OTHER and where != OTHER:
                # Also saved by a layer (e.g. attention's output is proj's input): the layer
                # needs it, so it is charged to the layer; it is still counted once.
                self.by_layer[OTHER] -= nbytes
                self.by_layer[where] = self.by_layer.get(where, 0) + nbytes
                self._owner[key] = where
            return
        self._owner[key] = where
        self.by_layer[where] = self.by_layer.get(where, 0) + nbytes
        self.records[key] = [nbytes, tuple(t.shape), t.dtype,
                             self._mods[-1] if self._mods else ""]
        self.dtypes.setdefault(where, set()).add(str(t.dtype).replace("torch.", ""))

    def _enter_hook(self, name: str):
        def hook(module, args):
            self._stack.append(name)  # returns None: the input is left unchanged
        return hook

    def _exit_hook(self, module, args, output):
        self._stack.pop()

    def _enter_mod(self, name: str):
        def hook(module, args):
            self._mods.append(name)
        return hook

    def _exit_mod(self, module, args, output):
        self._mods.pop()

    def __enter__(self):
        for name, mod in self.model.named_modules():
            if isinstance(mod, self.layer_types):
                self.by_layer.setdefault(name, 0)
                self._handles.append(mod.register_forward_pre_hook(self._enter_hook(name)))
                self._handles.append(mod.register_forward_hook(self._exit_hook))
            if self.track_modules and name:
                self._handles.append(mod.register_forward_pre_hook(self._enter_mod(name)))
                self._handles.append(mod.register_forward_hook(self._exit_mod))
        self._hooks_ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks_ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks_ctx.__exit__(*exc)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False

    @property
    def total(self) -> int:
        return sum(self.by_layer.values())

    @property
    def home_total(self) -> int:
        """``total`` less the storages on another device than the model's parameters (those
        by_dtype reports as "<dtype> (host)"): what of it takes that device's memory."""
        return self.total - sum(r[0] for k, r in self.records.items() if self._away(k))

    def _away(self, key: tuple) -> bool:
        """Whether the storage ``key`` lies on another device than the model's parameters."""
        return self._home is not None and key[0] != self._home

    def by_dtype(self) -> dict:
        """{dtype name: bytes} over the counted storages; those on another device than the
        model's parameters as "<dtype> (host)" (or the device's type)."""
        out: dict = defaultdict(int)
        for key, (nbytes, _, dtype, _) in self.records.items():
            name = str(dtype).replace("torch.", "")
            if self._away(key):
                name += " (host)" if key[0] == "cpu" else f" ({key[0]})"
            out[name] += nbytes
        return dict(out)

    @property
    def layer_total(self) -> int:
        return sum(v for k, v in self.by_layer.items() if k != OTHER)

    # ------------------------------------------------------------ what keeps each storage

    def label(self, root: torch.Tensor, compiled: "CompiledSavedCapture | None" = None) -> None:
        """Name, for every counted storage, the autograd node that keeps it (walked from
        ``root``'s graph before backward frees it): ``Node.attribute`` for built-in nodes, the
        Function and index for custom ones. A compiled graph's tensors are named by ``compiled``
        (the op of the forward graph that made each, and its module) when it saw that graph."""
        self.savers: dict = {}
        self.unhooked = 0  # bytes kept on a node past the hooks (none expected)
        seen, todo = set(), [root.grad_fn]
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            todo.extend(n for n, _ in node.next_functions)
            for label, mod, t in _kept(node, compiled):
                key, nbytes = _storage_key(t)
                if key in self._params:
                    continue
                if key not in self.records:
                    self.records[key] = [nbytes, tuple(t.shape), t.dtype, mod]
                    self.unhooked += nbytes
                if key not in self.savers:
                    self.savers[key] = label
                    if mod:
                        self.records[key][3] = mod

    def listing(self) -> dict:
        """{(module, kept by, dtype): [bytes, storages, a shape]} over the counted storages,
        block indices folded (``blocks.*.attn``); call ``label`` first for the 'kept by'."""
        savers = getattr(self, "savers", {})
        out: dict = defaultdict(lambda: [0, 0, None])
        for key, (nbytes, shape, dtype, mod) in self.records.items():
            row = out[(_fold(mod), savers.get(key, "?"), str(dtype).replace("torch.", ""))]
            row[0] += nbytes
            row[1] += 1
            row[2] = row[2] or shape
        return dict(out)


def _fold(fqn: str) -> str:
    return re.sub(r"\.\d+(?=\.|$)", ".*", fqn)


def _kept(node, compiled):
    """(label, module, tensor) for each tensor ``node`` keeps for its backward."""
    name = node.name()
    if hasattr(node, "_forward_cls"):  # a custom autograd.Function's node is its ctx
        ts = list(node.saved_tensors)
        extra = list(getattr(node, "_tensors_no_vc_check", ()))
        names = compiled.names(ts + extra) if compiled is not None and \
            name.startswith("CompiledFunction") else None
        for i, t in enumerate(ts + extra):
            if isinstance(t, torch.Tensor):
                lab, mod = names[i] if names else (f"{name}[{i}]", "")
                yield lab, mod, t
        return
    for a in dir(node):
        if not a.startswith("_saved_"):
            continue
        v = getattr(node, a)
        vs = v if isinstance(v, (tuple, list)) else (v,)
        for t in vs:
            if isinstance(t, torch.Tensor):
                yield f"{name}.{a[len('_saved_'):]}", "", t


def _module_path(stack) -> str:
    if not stack:
        return ""
    s = list(stack.values())[-1][0]
    s = re.sub(r"^L\['self'\]\.?|^L\['fn'\]\.?", "", s)
    s = re.sub(r"\._modules\['([^']+)'\]", r".\1", s)
    return re.sub(r"\[(\d+)\]", r".\1", s).lstrip(".")


def _op_name(target) -> str:
    s = str(getattr(target, "__name__", target))
    return re.sub(r"^aten\.|\.default$", "", s)


class CompiledSavedCapture:
    """``with CompiledSavedCapture() as cap:`` around torch.compile's first call: records, for each
    forward graph Inductor's partitioner builds, every tensor the graph saves for backward (in
    the order the compiled Function keeps them): the op that made it (through views, with its
    module) and the modules whose backward reads it, for ``SavedTensorMeter.label``."""

    def __init__(self):
        self.graphs: list[list[tuple]] = []  # per graph: (shape, dtype, label, module) per tensor
        self._ctx = None

    def __enter__(self):
        import torch._inductor.compile_fx as cfx

        orig = cfx.min_cut_rematerialization_partition

        def partition(joint, inputs, *args, num_fwd_outputs, **kw):
            fw, bw = orig(joint, inputs, *args, num_fwd_outputs=num_fwd_outputs, **kw)
            readers = {n.name: _readers(n) for n in bw.graph.find_nodes(op="placeholder")}
            saved = []
            for n in fw.graph.find_nodes(op="output")[0].args[0][num_fwd_outputs:]:
                v = n.meta.get("val") if hasattr(n, "meta") else None
                if isinstance(v, torch.Tensor):
                    op, made_in = _fx_label(n)
                    used_in = readers.get(n.name, "")
                    if made_in and made_in != used_in:
                        op += f" ({made_in})"
                    saved.append((tuple(v.shape), v.dtype, op, used_in))
            self.graphs.append(saved)
            return fw, bw

        self._ctx = contextlib.ExitStack()
        self._ctx.enter_context(_patched(cfx, "min_cut_rematerialization_partition", partition))
        return self

    def __exit__(self, *exc):
        self._ctx.close()
        return False

    def names(self, tensors) -> "list[tuple[str, str]] | None":
        sig = [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else None
               for t in tensors]
        for g in reversed(self.graphs):
            if [s[:2] for s in g] == sig:
                return [s[2:] for s in g]
        return None


@contextlib.contextmanager
def _patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _is_view(n) -> bool:
    return getattr(n.target, "is_view", False) and bool(n.args)


def _readers(n) -> str:
    """The modules (block indices folded) whose backward reads ``n``, through views."""
    mods, todo = set(), list(n.users)
    while todo:
        u = todo.pop()
        if _is_view(u) or u.target is operator.getitem:
            todo.extend(u.users)
            continue
        if u.op != "output":
            mods.add(_fold(_module_path(u.meta.get("nn_module_stack"))))
    return "+".join(sorted(m for m in mods if m))


def _fx_label(n) -> tuple[str, str]:
    """(op, module) that made a forward-graph node, through views ('input' for a graph input)."""
    viewed = False
    while True:
        src = n.args[0] if n.target is operator.getitem else n
        if not _is_view(src):
            break
        n, viewed = src.args[0], True
    if n.op == "placeholder":
        return f"input {n.name}", ""
    op = _op_name(src.target) + (f"[{n.args[1]}]" if src is not n else "")
    return op + (" (viewed)" if viewed else ""), _fold(_module_path(
        n.meta.get("nn_module_stack") or src.meta.get("nn_module_stack")))
