"""What one training step of a timm model keeps for backward, eager or under torch.compile, per
image and fixed (bf16 autocast; HOT on the reference backend; any device, the CPU included).

    python benchmarks/saved_bytes.py [--model vit_base_patch16_224] [--batch 2]
                                     [--modes bf16,hot,hot_rc] [--compile] [--rc-flag] [--list]

Counted with saved-tensor hooks (hot.analysis.saved: each storage once, parameters excluded), at
``batch`` and ``2 * batch`` images: the difference over ``batch`` is what grows with the batch
(activations, MiB per image), the rest is fixed (bf16: autocast's weight copies). Under
torch.compile the partitioner decides what to keep, so this is where HLAConfig(abc="recompute")
and ``--rc-flag`` (torch._functorch.config.ban_recompute_materialized_backward = False) show.
hot = HOT as configured by default (abc="auto"), hot_save / hot_rc = HOT with abc="save" /
"recompute". ``--list`` also lists what is kept, grouped by module (eagerly the one that saves
it, under compile those whose backward reads it; block indices folded), what keeps it (eagerly
the autograd node, under compile the op of the forward graph that made it, with its module)
and dtype, in MiB per image and fixed. The GPU peak of the full step is hot.bench.e2e's job; this
count explains it (docs/performance.md, "Memory").
"""
import argparse
import contextlib

import torch
import torch.nn.functional as F

import hot
from hot.analysis.saved import CompiledSavedCapture, SavedTensorMeter

ABC = {"hot": None, "hot_save": "save", "hot_rc": "recompute"}


def measure(model, fwd, batch: int, compiled: bool) -> SavedTensorMeter:
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    cap = CompiledSavedCapture() if compiled else contextlib.nullcontext()
    with cap, SavedTensorMeter(model, track_modules=not compiled) as meter, \
            torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(fwd(x), torch.zeros(batch, dtype=torch.long))
    meter.label(loss, cap if compiled else None)
    loss.backward()  # the step runs whole (a compiled backward is built, too)
    return meter


def print_listing(m1: SavedTensorMeter, m2: SavedTensorMeter, batch: int) -> None:
    l1, l2 = m1.listing(), m2.listing()
    rows = []
    for k in dict.fromkeys([*l1, *l2]):
        b1, n1, shape = l1.get(k, (0, 0, None))
        b2, n2, shape2 = l2.get(k, (0, 0, None))
        per = (b2 - b1) / batch
        rows.append((per, b1 - per * batch, k, shape or shape2, n1))
    rows.sort(key=lambda r: (-r[0], -r[1]))
    print(f"| module | kept by | dtype | shape at batch {batch} | storages | MiB per image "
          f"| fixed MiB |\n|---|---|---|---|---:|---:|---:|")
    for per, fixed, (mod, by, dt), shape, n in rows:
        if abs(per) < 2**10 and abs(fixed) < 2**10:
            continue
        print(f"| {mod or '-'} | {by} | {dt} | {tuple(shape) if shape else '-'} | {n} | "
              f"{per / 2**20:.3f} | {fixed / 2**20:.2f} |")
    if m1.unhooked or m2.unhooked:
        print(f"(kept past the hooks, counted above: {m1.unhooked} / {m2.unhooked} bytes)")
    print(flush=True)


def main() -> None:
    import timm
    import torch._functorch.config as fc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--modes", default="bf16,hot,hot_rc")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--rc-flag", action="store_true")
    p.add_argument("--list", action="store_true", help="list what is kept, by module and op")
    a = p.parse_args()
    print(f"{a.model}, batches {a.batch} and {2 * a.batch}, compile={a.compile}, "
          f"ban_recompute_materialized_backward={not a.rc_flag}, torch {torch.__version__}")
    print("| mode | MiB per image | fixed MiB |\n|---|---:|---:|")
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        m = timm.create_model(a.model, pretrained=False, num_classes=1000)
        if mode != "bf16":
            cfg = hot.HOTConfig(seed=0)
            if ABC[mode] is not None:
                cfg = cfg.replace(hla={"abc": ABC[mode]})
            hot.convert(m, cfg, convert_head=True, backend="reference")
        torch._dynamo.reset()
        flag = fc.patch(ban_recompute_materialized_backward=False) if a.rc_flag \
            else contextlib.nullcontext()
        with flag:
            # dynamic=False: each batch size gets its own static graph, as a training run has
            fwd = torch.compile(m, dynamic=False) if a.compile else m
            m1, m2 = (measure(m, fwd, b, a.compile) for b in (a.batch, 2 * a.batch))
        t1, t2 = m1.total, m2.total
        per = (t2 - t1) / a.batch
        print(f"| {mode} | {per / 2**20:.2f} | {(t1 - per * a.batch) / 2**20:.1f} |", flush=True)
        if a.list:
            print_listing(m1, m2, a.batch)


if __name__ == "__main__":
    main()
