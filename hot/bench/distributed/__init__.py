"""HOT under torch.distributed: DDP and FSDP2 on 1 and 2 GPUs (NCCL), or 2 gloo processes on CPU.

    python -m hot.bench.distributed [--json PATH] [--workloads vit,llama] [--checks ...] ...
    torchrun --nproc-per-node 2 -m hot.bench.distributed ...   (the same run: see below)

Workloads: TinyViT (dim 128, depth 6, 4 heads, MLP 256, patch 4) on Fashion-MNIST, 128 images per
GPU; a Llama-style decoder (transformers' LlamaForCausalLM, random init: hidden 1024, 8 layers,
16 heads, FFN 4096, vocabulary 32000, 1024 tokens, 4 sequences per GPU) on fixed random-token
batches. Tiny sizes on CPU. bf16 autocast and fused AdamW on a GPU, float32 and AdamW on CPU.

Correctness checks (each prints PASS/FAIL with its numbers):
  exact       HOTConfig.exact(): the 2-rank loss curve (each rank half of a fixed global batch)
              equals the 1-process curve on the whole batch, DDP and FSDP2, within float32's
              reduction-order tolerance (report.py states it).
  paper       HOTConfig(seed): the 2-rank loss after --steps steps lies within HOT's seed noise,
              measured as the spread of the 1-rank losses over --seeds.
  lqs         every HOT layer's LQS decision is the same on every rank.
  checkpoint  save after LQS calibration, build a fresh model, load: decisions and step
              counters restored on every rank (DDP: module.state_dict(); FSDP2:
              torch.distributed.checkpoint).
  zero_gy     rank 1's g_y is all zero (loss times 0) in the calibrating step; nan_gy: a NaN in
              one HOT layer's g_y on rank 1. Both ranks must finish the step within
              --hang-timeout with identical decisions.
Speed (GPU): median step time (CUDA events, after warm-up), images or tokens per second, scaling
efficiency throughput(2) / (2 * throughput(1)), peak allocated memory per GPU; bf16 and HOT, DDP
and FSDP2.

How it runs: the launcher (this process) starts fresh worker processes for each block of phases
(world 1: rank 0 alone; world 2; then each g_y case), follows the records they append to files,
and ends a block's processes when a phase fails or outruns --phase-timeout (a watchdog in each
worker records the timeout and ends it), then starts the block again at the next phase. So one
failure costs one phase, nothing hangs, and the whole run stops within --budget seconds. Under
torchrun, rank 0 is the launcher and the other ranks exit at once: the workers are always the
launcher's own processes, so that it can end them.

Output: a line per phase and per check as they finish, one JSON file with everything (--json),
and, last, a Markdown table (GPU, GPU0-GPU1 link from `nvidia-smi topo -m`, torch/CUDA/NCCL
versions, the checks, the speed rows).
"""

from .cli import main, run

__all__ = ["main", "run"]
