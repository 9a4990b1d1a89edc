"""Benchmarks: per-layer backward of the fast backend (hot.bench.backward, CUDA GPU) and one
training step of a whole model, ViT-B/16 or a Llama-style decoder, against bf16 and torchao
float8 (hot.bench.e2e)."""
