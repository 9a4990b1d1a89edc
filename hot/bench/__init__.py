"""Benchmarks of the fast backend (need a CUDA GPU): per-layer backward (hot.bench.backward) and
one ViT-B/16 training step (hot.bench.e2e)."""
