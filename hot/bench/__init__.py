"""Benchmarks, each reached from the hot command (hot.cli.bench): the per-layer backward of the
fast backend (hot.bench.backward, `hot bench layer`, CUDA GPU), one training step of a whole
model, ViT-B/16 or a Llama-style decoder, against bf16 and torchao float8 (hot.bench.e2e, `hot
bench step`), and DDP / FSDP2 on 1 and 2 GPUs (hot.bench.distributed, `hot bench gpus`); the
quality study (hot.bench.study) runs `hot train` cells."""
