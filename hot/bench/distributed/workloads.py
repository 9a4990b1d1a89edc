"""The two workloads: TinyViT on Fashion-MNIST (images) and a Llama-style decoder on random tokens.

Each builds its model from a fixed seed (the same weights in every process of every run), cuts a
fixed global batch of each step into equal per-rank slices, and computes a mean loss, so that the
mean of the ranks' losses (and, after the gradient all-reduce, of their gradients) is the loss
(gradient) of the whole global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

WORKLOADS = ("vit", "llama")


@dataclass(frozen=True)
class ViTSize:
    """hot.models.vit.TinyViT on 28x28 grey images; ``batch`` images per GPU."""

    dim: int
    depth: int
    heads: int
    mlp: int
    patch: int
    batch: int


@dataclass(frozen=True)
class LlamaSize:
    """transformers' LlamaForCausalLM, random init; ``batch`` sequences of ``seq`` tokens per
    GPU."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    batch: int


VIT_GPU = ViTSize(dim=128, depth=6, heads=4, mlp=256, patch=4, batch=128)
VIT_CPU = ViTSize(dim=32, depth=2, heads=2, mlp=64, patch=4, batch=16)
LLAMA_GPU = LlamaSize(hidden=1024, layers=8, heads=16, ffn=4096, vocab=32000, seq=1024, batch=4)
LLAMA_CPU = LlamaSize(hidden=64, layers=2, heads=4, ffn=128, vocab=256, seq=32, batch=2)


class Workload:
    """A model, its batches and its loss. ``units`` counts what one GPU's batch holds (images or
    tokens), for throughput; ``unit`` names it."""

    name: str
    unit: str
    batch: int  # per GPU
    units: int

    def build(self, device: torch.device, seed: int) -> nn.Module:
        raise NotImplementedError

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The repeated blocks, each its own FSDP2 unit."""
        raise NotImplementedError

    def batch_at(self, step: int, size: int, lo: int, hi: int, device: torch.device):
        """Examples [lo, hi) of the global batch of ``size`` examples used at ``step``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        raise NotImplementedError


class ViTWorkload(Workload):
    name, unit = "vit", "images"

    def __init__(self, size: ViTSize, data_root: Optional[str], log):
        self.size, self.batch, self.units = size, size.batch, size.batch
        self.x, self.y, self.mean, self.std, self.note = _images(data_root, log)
        # A fixed order of the training set, the same in every process.
        self.order = torch.randperm(len(self.y), generator=torch.Generator().manual_seed(0))

    def build(self, device, seed):
        from hot.models.vit import TinyViT

        s = self.size
        torch.manual_seed(seed)
        return TinyViT(image_size=28, channels=1, classes=10, patch=s.patch, dim=s.dim,
                       depth=s.depth, heads=s.heads, mlp=s.mlp).to(device)

    def blocks(self, model):
        return list(model.blocks)

    def batch_at(self, step, size, lo, hi, device):
        n = len(self.order)
        idx = self.order[(torch.arange(lo, hi) + step * size) % n]
        x = (self.x[idx].float() / 255.0 - self.mean) / self.std
        return x.to(device), self.y[idx].to(device)

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)


def _images(data_root: Optional[str], log):
    """(uint8 images (N, 1, 28, 28), int64 labels, mean, std, note): Fashion-MNIST, else MNIST-5k,
    else synthetic images (random pixels, random labels), saying which through ``log``."""
    from hot.data import DataUnavailableError, load_dataset

    try:
        d = load_dataset("fashion-mnist", data_root, fallback=True, log=log)
        return d.x_train, d.y_train, d.mean[0], d.std[0], d.note or "Fashion-MNIST"
    except DataUnavailableError as e:
        log(f"note: {e}\nnote: neither Fashion-MNIST nor MNIST-5k is installed: synthetic "
            f"images (uniform random pixels, random labels) instead.")
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (8192, 1, 28, 28), dtype=torch.uint8, generator=g)
        y = torch.randint(0, 10, (8192,), generator=g)
        return x, y, 0.5, 0.29, "synthetic images (no Fashion-MNIST, no MNIST-5k)"


class LlamaWorkload(Workload):
    name, unit = "llama", "tokens"

    def __init__(self, size: LlamaSize, distinct_batches: int):
        self.size, self.batch, self.units = size, size.batch, size.batch * size.seq
        self.distinct = distinct_batches
        self._pool: dict = {}
        self.note = (f"random tokens: {distinct_batches} fixed global batches, repeated (the "
                     f"model memorizes them, so the loss falls)")

    def build(self, device, seed):
        from transformers import LlamaConfig, LlamaForCausalLM

        s = self.size
        cfg = LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
                          num_hidden_layers=s.layers, num_attention_heads=s.heads,
                          num_key_value_heads=s.heads, max_position_embeddings=s.seq,
                          use_cache=False, tie_word_embeddings=False,
                          attn_implementation="sdpa")
        torch.manual_seed(seed)
        # Built on the device itself: initializing ~200M parameters on the CPU takes seconds.
        with torch.device(device):
            return LlamaForCausalLM(cfg)

    def blocks(self, model):
        return list(model.model.layers)

    def batch_at(self, step, size, lo, hi, device):
        k = (step % self.distinct, size)
        if k not in self._pool:
            g = torch.Generator().manual_seed(1000 + k[0])
            self._pool[k] = torch.randint(0, self.size.vocab, (size, self.size.seq), generator=g)
        return self._pool[k][lo:hi].to(device)

    def loss(self, model, batch):
        # Causal-LM loss: mean cross-entropy of each next token (B * (seq - 1) per rank).
        return model(input_ids=batch, labels=batch).loss


def make(name: str, opts, log) -> Workload:
    if name == "vit":
        return ViTWorkload(opts.vit, opts.data_root, log)
    return LlamaWorkload(opts.llama, opts.llama_batches)
