"""A small Vision Transformer for the demo: Linear patch embedding, pre-norm blocks, CLS head.

Every learnable matrix is an nn.Linear (attention uses one fused qkv Linear and an output
projection), so ``hot.convert`` reaches all of them. Attention itself is
``F.scaled_dot_product_attention`` (no Linear there, so it stays exact under HOT).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"TinyViT: dim={dim} is not divisible by heads={heads}; "
                             f"pick heads that divide dim.")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.fc2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class TinyViT(nn.Module):
    """ViT for (B, C, H, W) images: non-overlapping ``patch`` x ``patch`` patches, each flattened
    and mapped by one Linear to ``dim``; a learned CLS token and position embedding; ``depth``
    pre-norm blocks; LayerNorm and a Linear head on the CLS token."""

    def __init__(self, image_size: int = 28, channels: int = 1, classes: int = 10,
                 patch: int = 4, dim: int = 128, depth: int = 6, heads: int = 4, mlp: int = 256):
        super().__init__()
        if image_size % patch:
            raise ValueError(f"TinyViT: image_size={image_size} is not a multiple of "
                             f"patch={patch}; resize the images or change --patch.")
        self.patch = patch
        self.config = dict(image_size=image_size, channels=channels, classes=classes,
                           patch=patch, dim=dim, depth=depth, heads=heads, mlp=mlp)
        tokens = (image_size // patch) ** 2
        self.patch_embed = nn.Linear(channels * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.ModuleList([Block(dim, heads, mlp) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, H/p * W/p, C*p*p), patches in row-major order."""
        b, c, h, w = x.shape
        p = self.patch
        x = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch_embed(self.patchify(x))
        t = torch.cat([self.cls.expand(t.shape[0], -1, -1), t], dim=1) + self.pos
        for blk in self.blocks:
            t = blk(t)
        return self.head(self.norm(t[:, 0]))
