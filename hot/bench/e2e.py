"""One training step of a whole model, HOT against bf16 autocast and torchao float8, each eager or
compiled: median step time over timed steps after warm-up (CUDA events), the fastest step,
peak allocated memory and the loss of every step.

    python -m hot.bench.e2e [--model vit-b|llama-1b|llama-tiny] [--modes M1,M2,...]
                            [--batch N] [--seq S] [--steps 10] [--warmup 3] [--device cuda|cpu]
                            [--find-batch] [--in-process] [--exclude-head] [--profile]
                            [--kernels DIR] [--json out.json]

Models (random init, nothing downloaded): ``vit-b`` (default) is timm's vit_base_patch16_224,
1000 classes, on random 224x224 images, batch 128; ``llama-1b`` and ``llama-tiny`` are the
decoders of hot.models.llama (``llama-tiny`` with a 32000-token vocabulary here) trained as causal
LMs on random token sequences of ``--seq`` tokens (default: the preset's), the loss computed
inside the compiled region. Every step: bf16 autocast forward, loss, backward, fused AdamW
(lr 1e-4). The steps alternate between 2 fixed batches, so step i's loss is comparable across
modes; modes that share the forward (bf16, hot) give the same first loss.

Mode = method + compilation:
  method  a recipe of hot.recipes (`hot gbops --help` lists them), with its config and seed 0,
          on every Linear, fast backend (reference on CPU); every step runs under bf16
          autocast whatever the recipe's own, so e.g.
          bf16       exact, plain nn.Linear
          hot        HOT (HOTConfig()); hot-bf16 is the same here
          paper      the paper's setting (HOTConfig.paper(): fixed low-pass HLA rows, 4-bit HQ)
          hot-q      HOT with the quantized forward (HOTConfig.quantized(): the forward GEMM on
                     INT8 HQ codes, the same backward as hot)
          and two variants of hot:
          hot_ref    HOT on the reference backend inside quant.hash_rng() (the fast kernels'
                     random stream: the same computation up to rare flipped codes)
          hot_exact  the HOT wrappers with HOTConfig.exact() (exact gradients)
          float8_tw  torchao convert_to_float8_training, recipe 'tensorwise' (the output layer
                     stays exact; emulated on CPU)
          float8_rw  the same with recipe 'rowwise'
  suffix  (none)        eager
          _compile      torch.compile
          _compile_cg   torch.compile(mode="reduce-overhead"): CUDA graphs, HOT's operators
                        captured with the rest (their seeds follow the step counters in device
                        memory); _compile_ro is the same
          _compile_rc   torch.compile with torch._functorch.config
                        .ban_recompute_materialized_backward = False (the partitioner may recompute
                        tensors that backward materializes); HOT methods then also use
                        HLAConfig(abc="recompute") unless --abc names another
Defaults: vit-b bf16,bf16_compile,hot,hot_compile,hot-q_compile,hot-q_compile_cg,
float8_tw_compile; the decoders bf16,bf16_compile,hot,hot_compile,hot_compile_cg,hot-q_compile,
hot-q_compile_cg,float8_tw_compile,float8_rw_compile.

--memory adds, per mode, where the step's memory goes: the bytes the forward saves for
backward (autograd's saved tensors, by dtype, counted once per storage; one extra untimed
step), the parameters, the optimizer's state, and the rest of the peak (transients: logits,
gradients, workspaces); on a GPU also what is live at the peak of one more step, by where it was
allocated (hot.analysis.peak: the allocator's trace).

Each mode runs in a fresh process (this module with --in-process --modes MODE), because
torch.compile's caches and the allocator's fragmentation would otherwise carry from one mode to
the next; --in-process runs them all here. A mode that fails records its error and the others
still run. --find-batch: a mode that runs out of memory is retried at half the batch until it
fits (each record says the batch it ran and the batches that did not fit); compare such modes by
tokens (or images) per second.

Default batch of llama-1b (seq 2048): 16, estimated, not measured, as the largest that fits
bf16 + torch.compile on an 80 GB H100 (about 79 GiB usable):
  - fixed: fp32 weights, gradients and the two AdamW moments, 16 bytes x 1.138e9 = 17.0 GiB,
    plus the bf16 weight copies the forward keeps for backward, 2.1 GiB: about 19 GiB;
  - kept per token and layer (h = 2048, k/v width 1024, FFN f = 8192): the fp32 residual stream
    into both RMSNorms (2 x 4h bytes), the bf16 normed inputs of q/k/v and gate/up (2 x 2h), q,
    k and v after the rotary embedding (2h + 2 x 2 x 1024), the attention output (2h), and the
    gate and up outputs (2 x 2f; SiLU(gate) * up recomputed, else 2f more): 68 to 84 KiB, so
    1.06 to 1.31 MiB per token over 16 layers;
  - the output layer per token: bf16 logits (2 x 32000 bytes) and, at the start of backward,
    their fp32 and bf16 gradients (6 x 32000): about 0.25 MiB;
  - so 1.31 to 1.56 MiB per token: 16 x 2048 tokens take 42 to 50 GiB, 61 to 69 GiB in all;
    24 sequences would take 82 to 94 GiB. Pass --batch to override, --find-batch to search.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import recipes
from ..common.config import ABC_MODES
from .argparser import BenchParser, UsageErrorFactory

# e2e's methods: every registered recipe (hot.recipes) under its own name, and two variants of
# "hot": "hot_ref" on the reference backend, "hot_exact" its layers with HOTConfig.exact().
# Every step runs under bf16 autocast, so a recipe's own autocast does not matter here. The
# float8 methods are torchao's recipes, peers measured beside HOT's, not HOT recipes.
HOT_VARIANTS = {"hot_ref": "hot", "hot_exact": "hot"}
FLOAT8_RECIPES = {"float8_tw": "tensorwise", "float8_rw": "rowwise"}


def mode_methods() -> tuple[str, ...]:
    """The methods a mode may name: the recipes registered now, the variants, the peers."""
    return (*recipes.names(), *HOT_VARIANTS, *FLOAT8_RECIPES)
SUFFIXES = ("", "_compile", "_compile_cg", "_compile_ro", "_compile_rc")
MODELS = ("vit-b", "llama-1b", "llama-tiny")
DEFAULT_MODES = {
    "vit-b": "bf16,bf16_compile,hot,hot_compile,hot-q_compile,hot-q_compile_cg,float8_tw_compile",
    "llama": "bf16,bf16_compile,hot,hot_compile,hot_compile_cg,hot-q_compile,hot-q_compile_cg,"
             "float8_tw_compile,float8_rw_compile",
}
DEFAULT_BATCH = {"vit-b": 128, "llama-1b": 16, "llama-tiny": 2}
BENCH_VOCAB = 32000  # llama-tiny's vocabulary here (the preset takes it from a tokenizer)


class ModeError(ValueError):
    """A mode name that is not METHOD + SUFFIX, or a mode that cannot run on this device."""


@dataclass(frozen=True)
class Mode:
    """A parsed mode name: method (mode_methods()), compile (None, 'default' or
    'reduce-overhead') and recompute (the _compile_rc partitioner flag and, for HOT,
    abc='recompute')."""

    name: str
    method: str
    compile: Optional[str]
    recompute: bool

    @property
    def recipe(self):
        """The recipe of the method (hot.recipes.Recipe); None for the float8 peers."""
        if self.method in FLOAT8_RECIPES:
            return None
        return recipes.get(HOT_VARIANTS.get(self.method, self.method))

    @property
    def hot(self) -> bool:
        """Whether the method converts layers to HOT."""
        return self.recipe is not None and not self.recipe.exact


def parse_mode(name: str) -> Mode:
    """The Mode of ``name`` = one of mode_methods() followed by one of SUFFIXES; ModeError
    otherwise."""
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        method = name[: len(name) - len(suffix)] if suffix else name
        if name.endswith(suffix) and method in mode_methods():
            comp = {"": None, "_compile": "default", "_compile_rc": "default"}.get(
                suffix, "reduce-overhead")
            return Mode(name, method, comp, suffix == "_compile_rc")
    raise ModeError(f"mode {name!r} is not METHOD[SUFFIX] with METHOD in {list(mode_methods())} "
                    f"and SUFFIX in {[s for s in SUFFIXES if s]} (or none), e.g. hot_compile.")


@dataclass(frozen=True)
class Workload:
    """What one step trains: ``model`` (MODELS), ``batch`` sequences or images, ``seq`` tokens
    per sequence (decoders only) on ``device``."""

    model: str = "vit-b"
    batch: int = 128
    seq: Optional[int] = None
    device: str = "cuda"
    vocab: int = BENCH_VOCAB

    @property
    def llm(self) -> bool:
        return self.model.startswith("llama")

    @property
    def head(self) -> str:
        """The output layer's name (kept exact by the float8 modes, and by --exclude-head)."""
        return "lm_head" if self.llm else "head"

    def build(self) -> nn.Module:
        torch.manual_seed(0)  # the same initial weights in every mode
        if self.llm:
            from ..models.llama import LLAMA_PRESETS, llama_preset

            vocab = LLAMA_PRESETS[self.model]["vocab"] or self.vocab
            return llama_preset(self.model, vocab=vocab, seq=self.seq, device=self.device)
        import timm

        return timm.create_model("vit_base_patch16_224", pretrained=False,
                                 num_classes=1000).to(self.device)

    def batches(self, model: nn.Module) -> list:
        """2 fixed batches (inputs, targets), the same in every mode."""
        g = torch.Generator().manual_seed(1)
        out = []
        for _ in range(2):
            if self.llm:
                vocab = model.config.vocab_size
                ids = torch.randint(0, vocab, (self.batch, self.seq), generator=g)
                # next-token targets; the last position has none (ignore_index)
                tgt = torch.cat([ids[:, 1:], torch.full((self.batch, 1), -100)], dim=1)
                out.append((ids.to(self.device), tgt.to(self.device)))
            else:
                x = torch.randn(self.batch, 3, 224, 224, generator=g)
                y = torch.randint(0, 1000, (self.batch,), generator=g)
                out.append((x.to(self.device), y.to(self.device)))
        return out

    def loss_fn(self, model: nn.Module, compile_kw: Optional[dict]) -> Callable:
        """(inputs, targets) -> loss; compiled with ``compile_kw`` unless None. A decoder's
        loss is compiled with it (the fp32 logits of a 32k vocabulary are its largest tensors);
        ViT-B compiles the model alone."""
        if self.llm:
            def loss(ids, tgt):
                logits = model(input_ids=ids).logits
                return F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten())
            return loss if compile_kw is None else torch.compile(loss, **compile_kw)
        fwd = model if compile_kw is None else torch.compile(model, **compile_kw)
        return lambda x, y: F.cross_entropy(fwd(x), y)

    def items(self) -> int:
        """Tokens (decoders) or images (ViT-B) in one step."""
        return self.batch * (self.seq if self.llm else 1)


class HotTweaks(NamedTuple):
    """Changes to the HOT modes' config (and, exclude_head, to which layers convert)."""

    exclude_head: bool = False  # keep the output layer exact (float8 always does)
    min_in_features: int = 0  # HOTConfig(min_in_features=...)
    hla_amax: str = "current"  # HLAConfig(amax=...)
    abc: Optional[str] = None  # HLAConfig(abc=...); None: the recipe's
    hla_share: str = "none"  # HLAConfig(share=...)


def _prepare(m: nn.Module, mode: Mode, w: Workload, tw: HotTweaks) -> dict:
    """Convert ``m`` for ``mode`` in place; returns facts for the record."""
    dev = torch.device(w.device)
    if mode.hot:
        import hot

        recipe = mode.recipe
        cfg = (hot.HOTConfig.exact() if mode.method == "hot_exact"
               else recipe.config.replace(seed=0))
        if mode.recompute or tw.abc:  # --abc wins over the _compile_rc default
            cfg = cfg.replace(hla={"abc": tw.abc or "recompute"})
        if tw.min_in_features:
            cfg = cfg.replace(min_in_features=tw.min_in_features)
        if tw.hla_amax != "current" and mode.method != "hot_exact":
            cfg = cfg.replace(hla={"amax": tw.hla_amax})
        if tw.hla_share != "none" and mode.method != "hot_exact":
            cfg = cfg.replace(hla={"share": tw.hla_share})
        backend = "reference" if mode.method == "hot_ref" or dev.type != "cuda" else "fast"
        filt = (lambda fqn, _: fqn != w.head) if tw.exclude_head else None
        recipe.prepare(m, cfg, filter=filt, backend=backend)
        return {"recipe": recipe.name, "hot_backend": backend, "hot_layers": len(hot.hot_layers(m)),
                "min_in_features": tw.min_in_features, "hla_amax": cfg.hla.amax,
                "abc": cfg.hla.abc, "hla_share": cfg.hla.share, "forward": cfg.forward}
    if mode.method in FLOAT8_RECIPES:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as e:
            raise ModeError(f"mode {mode.name!r} needs torchao: pip install torchao "
                            f"(0.17 for torch 2.11)") from e
        from torchao.float8.float8_linear import Float8Linear

        cfg = Float8LinearConfig.from_recipe_name(FLOAT8_RECIPES[mode.method])
        if dev.type != "cuda":
            # float8 matmuls (torch._scaled_mm) need an sm89+ GPU; elsewhere torchao emulates
            # them, which checks the conversion but times nothing meaningful.
            cfg = dataclasses.replace(cfg, emulate=True)
        convert_to_float8_training(m, config=cfg, module_filter_fn=lambda _, fqn: fqn != w.head)
        return {"float8_layers": sum(isinstance(x, Float8Linear) for x in m.modules()),
                "float8_emulated": cfg.emulate}
    return {}


def step_time(mode: str, batch: int = 128, warmup: int = 3, steps: int = 10,
              profile: bool = False, *, model: str = "vit-b", seq: Optional[int] = None,
              device: str = "cuda", exclude_head: bool = False,
              min_in_features: int = 0, hla_amax: str = "current", abc: Optional[str] = None,
              memory: bool = False, hla_share: str = "none",
              kernels: Optional[str] = None) -> dict:
    """Train ``warmup`` + ``steps`` steps of ``model`` in ``mode`` (see the module docstring);
    the record of the timed steps. Raises on failure (run_mode turns that into a record).
    exclude_head, min_in_features, hla_amax, abc, hla_share: HotTweaks. kernels: with
    ``profile``, a path for every kernel of the profiled steps (write_kernel_rows), written once
    the mode has run to its end: an attempt that fails after its profile (out of memory in the
    --memory steps, which --find-batch retries at half the batch) leaves no file behind."""
    tw = HotTweaks(exclude_head, min_in_features, hla_amax, abc, hla_share)
    md = parse_mode(mode)
    w = _workload(model, batch, seq, device)
    if md.compile == "reduce-overhead" and torch.device(device).type != "cuda":
        raise ModeError(f"mode {mode!r} records CUDA graphs: it needs --device cuda.")
    import torch._functorch.config as fc
    import torch._inductor.config as ic

    # Both flags are read when a graph is compiled (warm-up); patched so later modes of the same
    # process start from the defaults.
    with contextlib.ExitStack() as st:
        if md.recompute:
            st.enter_context(fc.patch(ban_recompute_materialized_backward=False))
        if md.compile == "reduce-overhead":
            st.enter_context(ic.patch(graph_partition=True))
        out, rows = _step_time(md, w, warmup, steps, profile, tw, memory, kernels is not None)
    if rows is not None:  # asked for (kernels) and profiled on a GPU
        write_kernel_rows(rows, kernels)
    return out


def _workload(model: str, batch: int, seq: Optional[int], device: str) -> Workload:
    if model not in MODELS:
        raise ModeError(f"--model {model!r}: choose one of {list(MODELS)}.")
    if batch <= 0:
        raise ModeError(f"--batch {batch}: must be a positive number of sequences or images.")
    if model.startswith("llama"):
        from ..models.llama import LLAMA_PRESETS

        seq = seq or LLAMA_PRESETS[model]["seq"]
        if seq < 2:
            raise ModeError(f"--seq {seq}: a causal LM needs at least 2 tokens per sequence.")
    elif seq is not None:
        raise ModeError(f"--seq {seq}: --model {model} takes images, not sequences; drop --seq.")
    return Workload(model, batch, seq, device)


def _step_time(md: Mode, w: Workload, warmup: int, steps: int, profile: bool,
               tw: HotTweaks, memory: bool = False, kernels: bool = False
               ) -> tuple[dict, Optional[list]]:
    """(the record, the profiled steps' kernel rows (kernel_rows) when ``kernels`` and a GPU
    profile ran, else None)."""
    from ..common import quant

    dev = torch.device(w.device)
    cuda = dev.type == "cuda"
    m = w.build()
    facts = _prepare(m, md, w, tw)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
    if md.compile:
        import torch._dynamo.utils as du

        du.counters.clear()  # the counters are process-wide: count this mode's compiles only
    # HOT layers trace through the operators of hot.nn.autograd: no graph break at a HOT layer.
    fn = w.loss_fn(m, None if md.compile is None else {"mode": md.compile})
    data = w.batches(m)

    def step(i):
        if md.compile == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a training step: new graph outputs
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = fn(*data[i % 2])
        with quant.hash_rng() if md.method == "hot_ref" else contextlib.nullcontext():
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    losses = []
    t0 = time.perf_counter()
    for i in range(warmup):
        losses.append(float(step(i)))
    sync()
    warm_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            loss = step(warmup + i)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            loss = step(warmup + i)
            times.append(1e3 * (time.perf_counter() - t))
        losses.append(float(loss))
    in_order = [round(t, 3) for t in times]  # the spread and any drift, for the reader to judge
    times.sort()
    out = {"mode": md.name, "model": w.model, "batch": w.batch, "seq": w.seq,
           "device": torch.cuda.get_device_name(dev) if cuda else str(dev),
           "params": sum(p.numel() for p in m.parameters()),
           "step_ms": times[len(times) // 2] if times else None,
           "min_ms": times[0] if times else None, "step_times_ms": in_order,
           "peak_GiB": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
           # CUDA graphs keep their intermediates in a private pool that is reserved, not
           # allocated, between replays: only the reserved peak shows what such a mode needs.
           "peak_reserved_GiB": torch.cuda.max_memory_reserved() / 2**30 if cuda else None,
           "loss": losses[-1], "losses": [round(v, 4) for v in losses], "warmup_s": warm_s,
           **facts}
    if times:
        out["tokens_per_s" if w.llm else "images_per_s"] = w.items() / (out["step_ms"] / 1e3)
    rows = None
    if profile and cuda:
        out["profile"], rows = _profile(lambda i: step(warmup + steps + i), keep_kernels=kernels)
    if memory:
        out["memory"] = _memory(lambda: step(warmup + steps), m, opt, out["peak_GiB"])
        if cuda:  # what is live at the peak, by origin, from one more step's allocator trace
            from ..analysis.peak import record_peak

            out["memory"]["at_peak"] = record_peak(lambda: step(warmup + steps + 1), dev).as_gib()
    if md.hot and cuda:
        from ..fast import native

        # layer backwards that ran as one C++ call so far in this process (hot.fast.native)
        out["native_backward_calls"] = native.CALLS["layer_backward"]
        out["native"] = native.why_off() or "on"
    if md.compile:
        try:
            import torch._dynamo.utils as du

            out["graph_breaks"] = int(sum(du.counters["graph_break"].values()))
            out["unique_graphs"] = int(du.counters["stats"].get("unique_graphs", 0))
        except Exception:
            pass
    del m, opt, fn, data
    _release(cuda)
    return out, rows


# Kernel categories of a profile: HOT's quantizer passes (the g_y, W and ABC passes are the
# Triton kernels of hot.fast.kernels.quantize: stats and quantize, or with a delayed HLA scale
# onepass and fixup), its integer GEMMs (CUTLASS int8, or the
# Triton fallback), and the rest (what HOT leaves as it is: forward GEMMs, attention, norms,
# elementwise, optimizer).
_PASS_KERNELS = ("stats_kernel", "quantize_kernel", "onepass_kernel", "fixup_kernel")
# HOT's CUTLASS GEMMs by their integer MMA: the atom names (Hopper's GMMA and Ampere's mma
# atoms, e.g. MMA_64x256x32_S32S8S8_SS_TN) and CUTLASS 2's saturating integer operator appear
# verbatim in the mangled names the profiler reports, which the C++ demanglers at hand (torch's
# and c++filt) fail to demangle for these kernels, so the names are matched as they come.
_INT_GEMM_MARKS = ("S32S8S8", "S32S4S4", "OpMultiplyAddSaturate", "signed char")


def kernel_category(name: str) -> str:
    """'hot_pass', 'int8_gemm' or 'other' for a CUDA kernel's name (mangled or not)."""
    if name.startswith(_PASS_KERNELS):
        return "hot_pass"
    if ("cutlass" in name and any(m in name for m in _INT_GEMM_MARKS)) \
            or name.startswith("int8_gemm"):
        return "int8_gemm"
    return "other"


def _profile(step, n: int = 2, top: int = 40, keep_kernels: bool = False
             ) -> tuple[dict, Optional[list]]:
    """GPU busy time per step (kernel durations summed, torch.profiler), the kernels that take
    most of it, grouped by name, and the busy time per kernel_category: where a step's time goes,
    and what HOT's own kernels cost; with ``keep_kernels`` also every kernel (kernel_rows)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n):
            step(i)
        torch.cuda.synchronize()
    rows = kernel_rows(prof.events()) if keep_kernels else None
    by = defaultdict(float)
    full = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            full[e.name] += e.device_time / 1e3 / n
    cat = defaultdict(float)
    for name, ms in full.items():
        by[name[:70]] += ms
        cat[kernel_category(name)] += ms
    busy = sum(by.values())
    top_ms = sorted(by.items(), key=lambda kv: -kv[1])[:top]
    return {"gpu_busy_ms": busy, "top_ms": [(k, round(v, 3)) for k, v in top_ms],
            "category_ms": {k: round(v, 3) for k, v in sorted(cat.items())}}, rows


def kernel_rows(events) -> list:
    """(start us, duration us, name) of every GPU kernel (and memset, memcpy) of a profile's
    events, in the order they started (the profiler's list is not)."""
    return sorted((e.time_range.start, e.device_time, e.name) for e in events
                  if e.device_type == torch.autograd.DeviceType.CUDA)


def write_kernel_rows(rows: list, path: str) -> int:
    """kernel_rows' rows to ``path``, one per line: start (us, the profiler's clock), duration
    (us), name; the number of lines. What a per-name sum hides shows here: the gaps between
    kernels, launches per step, and which kernel runs next to which."""
    with open(path, "x") as f:  # "x": never overwrite a record
        for start, us, name in rows:
            f.write(f"{start:.3f}\t{us:.3f}\t{name}\n")
    return len(rows)


def _memory(step, model: nn.Module, opt, peak_gib: Optional[float]) -> dict:
    """Where one step's memory goes (GiB): what the forward saves for backward, by dtype
    (hot.analysis.saved.SavedTensorMeter: each storage once, parameters excluded, a float8
    tensor as its data and scale; autograd's saved-tensor hooks, which compiled graphs call
    too), the parameters, the optimizer's state and, of the timed steps' peak, the rest."""
    from ..analysis.saved import SavedTensorMeter

    # No per-layer attribution (layer_types=()): module hooks would recompile the graph.
    with SavedTensorMeter(model, layer_types=()) as meter:
        step()
    gib = lambda n: round(n / 2**30, 3)  # noqa: E731
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                if torch.is_tensor(v))
    by = meter.by_dtype()
    out = {"saved_GiB": gib(meter.total), "saved_by_dtype_GiB": {k: gib(v) for k, v in by.items()},
           "saved_by_dtype_bytes": by, "params_GiB": gib(params), "optimizer_state_GiB": gib(state)}
    if peak_gib is not None:  # saves in host memory (abc="offload") take none of the peak
        out["rest_of_peak_GiB"] = round(peak_gib - (meter.home_total + params + state) / 2**30,
                                        3)
    return out


def _release(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def _is_oom(e: BaseException) -> bool:
    # inductor's autotuning and compile wrap an OOM in its own exception types; the message stays.
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def run_mode(mode: str, **kw) -> dict:
    """``step_time(mode, **kw)`` as a record; a failure becomes {"mode", "error", "oom",
    "trace"} (errors are data: the caller goes on with the next mode)."""
    try:
        return step_time(mode, **kw)
    except Exception as e:
        r = {"mode": mode, "model": kw.get("model", "vit-b"), "batch": kw.get("batch", 128),
             "error": f"{type(e).__name__}: {e}", "oom": _is_oom(e),
             "trace": traceback.format_exc()[-3000:]}
        import torch._dynamo

        torch._dynamo.reset()  # a failed compile leaves its guards and caches behind
        _release(torch.device(kw.get("device", "cuda")).type == "cuda")
        return r


def find_batch(run: Callable[[int], dict], batch: int) -> dict:
    """``run(batch)``, then ``run(batch // 2)`` and so on while the record says it ran out of
    memory and the batch can still halve. The record returned is the last one, with
    ``oom_batches``: the batches that ran out of memory, largest first."""
    tried = []
    while True:
        r = run(batch)
        if not r.get("oom"):
            break
        tried.append(batch)
        if batch == 1:
            break
        batch //= 2
    r["oom_batches"] = tried
    return r


def _isolated(mode: str, batch: int, a, timeout: float) -> dict:
    """``run_mode`` in a fresh interpreter (this module with --in-process); its record, or one
    that says how the process ended."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [sys.executable, "-m", "hot.bench.e2e", "--in-process", "--modes", mode,
               "--model", a.model, "--batch", str(batch), "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--device", a.device, "--json", out]
        cmd += ["--seq", str(a.seq)] if a.seq is not None else []
        cmd += ["--profile"] if a.profile else []
        cmd += ["--kernels", a.kernels] if a.kernels else []
        cmd += ["--memory"] if a.memory else []
        cmd += ["--exclude-head"] if a.exclude_head else []
        cmd += ["--min-in-features", str(a.min_in_features)] if a.min_in_features else []
        cmd += ["--hla-amax", a.hla_amax]
        cmd += ["--abc", a.abc] if a.abc else []
        cmd += ["--hla-share", a.hla_share]
        base = {"mode": mode, "model": a.model, "batch": batch}
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"")[-3000:]
            return {**base, "error": f"TimeoutExpired: the mode ran past {timeout:.0f} s",
                    "oom": False, "trace": tail.decode() if isinstance(tail, bytes) else tail}
        if p.returncode == 0 and os.path.isfile(out):
            with open(out) as f:
                return json.load(f)[0]
        return {**base, "error": f"the mode's process exited with status {p.returncode}",
                "oom": "out of memory" in p.stderr.lower(), "trace": p.stderr[-3000:]}


def _kernels_path(directory: str, mode: str) -> str:
    return os.path.join(directory, f"{mode}.tsv")


def main(argv=None, usage_error: Optional[UsageErrorFactory] = None) -> int:
    p = BenchParser(description=__doc__.splitlines()[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    epilog=__doc__[__doc__.index("Models ("):], usage_error=usage_error)
    p.add_argument("--model", default="vit-b", choices=MODELS)
    p.add_argument("--modes", default=None, help="comma-separated; default: per model (below)")
    p.add_argument("--batch", type=int, default=None,
                   help="sequences or images per step (default: vit-b 128, llama-1b 16, "
                        "llama-tiny 2)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (decoders; "
                   "default: the preset's)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compiles)")
    p.add_argument("--device", default="cuda", help="cuda[:N] or cpu (HOT on the reference "
                   "backend, float8 emulated, no CUDA graphs: a smoke run)")
    p.add_argument("--find-batch", action="store_true",
                   help="retry a mode that runs out of memory at half the batch")
    p.add_argument("--in-process", action="store_true",
                   help="run every mode in this process (default: a fresh process per mode)")
    p.add_argument("--mode-timeout", type=float, default=3600.0,
                   help="seconds a mode's process may run")
    p.add_argument("--exclude-head", action="store_true",
                   help="keep the output layer exact in the HOT modes too (float8 always does)")
    p.add_argument("--min-in-features", type=int, default=0,
                   help="HOTConfig(min_in_features=N) in the HOT modes: narrower layers run "
                        "exactly (default 0: every layer runs HOT)")
    p.add_argument("--hla-amax", choices=("current", "delayed"), default="current",
                   help="HLAConfig(amax=...) in the HOT modes (delayed: one read of g_y and x)")
    p.add_argument("--abc", choices=ABC_MODES, default=None,
                   help="HLAConfig(abc=...) in the HOT modes (default: the recipe's, auto)")
    p.add_argument("--hla-share", choices=("none", "siblings"), default="none",
                   help="HLAConfig(share=...) in the HOT modes (siblings: layers reading one "
                        "input form its codes once under torch.compile)")
    p.add_argument("--memory", action="store_true",
                   help="also record where the memory goes: saved tensors by dtype, parameters, "
                        "optimizer state, the rest of the peak (one extra untimed step); on a "
                        "GPU also what is live at the peak, by origin (one more step)")
    p.add_argument("--json", default=None, help="write the records (a JSON list) here")
    p.add_argument("--profile", action="store_true",
                   help="also profile 2 steps: GPU busy time and the kernels that take most of it")
    p.add_argument("--kernels", default=None, metavar="DIR",
                   help="with --profile: write every kernel of the profiled steps in the order "
                        "they ran (start us, duration us, name) to DIR/<mode>.tsv")
    a = p.parse_args(argv)
    for flag, v in (("--steps", a.steps), ("--batch", a.batch)):
        if v is not None and v <= 0:
            p.error(f"{flag} {v}: must be positive.")
    if a.warmup < 0:
        p.error(f"--warmup {a.warmup}: must be 0 or more.")
    if a.min_in_features < 0:
        p.error(f"--min-in-features {a.min_in_features}: must be 0 or more.")
    if a.kernels and not a.profile:
        p.error(f"--kernels {a.kernels}: the kernels come from the profile; add --profile.")
    if a.kernels and not os.path.isdir(a.kernels):
        p.error(f"--kernels {a.kernels}: not a directory; create it first.")
    if a.json and os.path.exists(a.json):
        p.error(f"--json {a.json} exists: pass a new path (results are never overwritten).")
    batch = a.batch or DEFAULT_BATCH[a.model]
    try:
        _workload(a.model, batch, a.seq, a.device)  # bad arguments fail once, not per mode
    except ModeError as e:
        p.error(str(e))
    modes = (a.modes or DEFAULT_MODES["llama" if a.model.startswith("llama") else a.model])
    kw = dict(warmup=a.warmup, steps=a.steps, profile=a.profile, model=a.model, seq=a.seq,
              device=a.device, exclude_head=a.exclude_head, min_in_features=a.min_in_features,
              hla_amax=a.hla_amax, abc=a.abc, memory=a.memory, hla_share=a.hla_share)
    mode_list = [m for m in modes.split(",") if m]
    for mode in mode_list if a.kernels else ():
        if os.path.exists(_kernels_path(a.kernels, mode)):
            p.error(f"--kernels {a.kernels}: {_kernels_path(a.kernels, mode)} exists: pass a new "
                    f"directory (results are never overwritten).")
    res = []
    for mode in mode_list:
        if a.in_process:
            kp = _kernels_path(a.kernels, mode) if a.kernels else None
            run = lambda b, mode=mode, kp=kp: run_mode(mode, batch=b, kernels=kp, **kw)
        else:
            run = lambda b, mode=mode: _isolated(mode, b, a, a.mode_timeout)
        r = find_batch(run, batch) if a.find_batch else run(batch)
        print(json.dumps({k: v for k, v in r.items() if k != "trace"}), flush=True)
        res.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
