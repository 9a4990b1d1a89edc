"""What one training step of a timm model keeps for backward, eager or under torch.compile, per
image and fixed (bf16 autocast; HOT on the reference backend; any device, the CPU included).

    python benchmarks/saved_bytes.py [--model vit_base_patch16_224] [--batch 2]
                                     [--modes bf16,hot,hot_rc] [--compile] [--rc-flag]

Counted with saved-tensor hooks (hot.analysis.saved: each storage once, parameters excluded), at
``batch`` and ``2 * batch`` images: the difference over ``batch`` is what grows with the batch
(activations, MiB per image), the rest is fixed (autocast's bf16 weight copies). Under
torch.compile the partitioner decides what to keep, so this is where HLAConfig(abc="recompute")
and ``--rc-flag`` (torch._functorch.config.ban_recompute_materialized_backward = False) show.
hot_rc = HOT with abc="recompute". The GPU peak of the full step is hot.bench.e2e's job; this
count explains it (docs/performance.md, "Memory").
"""
import argparse
import contextlib

import torch
import torch.nn.functional as F

import hot
from hot.analysis.saved import SavedTensorMeter


def saved_total(model, fwd, batch: int) -> int:
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with SavedTensorMeter(model) as meter, torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(fwd(x), torch.zeros(batch, dtype=torch.long))
    loss.backward()  # the step runs whole (a compiled backward is built, too)
    return meter.total


def main() -> None:
    import timm
    import torch._functorch.config as fc

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_base_patch16_224")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--modes", default="bf16,hot,hot_rc")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--rc-flag", action="store_true")
    a = p.parse_args()
    print(f"{a.model}, batches {a.batch} and {2 * a.batch}, compile={a.compile}, "
          f"ban_recompute_materialized_backward={not a.rc_flag}, torch {torch.__version__}")
    print("| mode | MiB per image | fixed MiB |\n|---|---:|---:|")
    for mode in a.modes.split(","):
        torch.manual_seed(0)
        m = timm.create_model(a.model, pretrained=False, num_classes=1000)
        if mode != "bf16":
            cfg = hot.HOTConfig(seed=0)
            if mode == "hot_rc":
                cfg = cfg.replace(hla={"abc": "recompute"})
            hot.convert(m, cfg, backend="reference")
        torch._dynamo.reset()
        flag = fc.patch(ban_recompute_materialized_backward=False) if a.rc_flag \
            else contextlib.nullcontext()
        with flag:
            # dynamic=False: each batch size gets its own static graph, as a training run has
            fwd = torch.compile(m, dynamic=False) if a.compile else m
            t1, t2 = (saved_total(m, fwd, b) for b in (a.batch, 2 * a.batch))
        per = (t2 - t1) / a.batch
        print(f"| {mode} | {per / 2**20:.2f} | {(t1 - per * a.batch) / 2**20:.1f} |", flush=True)


if __name__ == "__main__":
    main()
