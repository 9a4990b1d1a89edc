"""hot.data.lm (token batches, the Rotten Tomatoes LM split) and the perplexity metric."""

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

pytest.importorskip("transformers")

from hot.cli.lmtrain import perplexity
from hot.data import LM_DATASETS, load_dataset
from hot.data import DataUnavailableError
from hot.data.lm import IGNORE, TokenBatches, export_lm_files, rotten_tomatoes_lm

PAD = 0


def _batches(lengths, seq=40, vocab=30, multiple=16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (len(lengths), seq), generator=g)
    lengths = torch.tensor(lengths)
    ids[torch.arange(seq).unsqueeze(0) >= lengths.unsqueeze(1)] = PAD
    return TokenBatches(ids, lengths, PAD, multiple)


def test_targets_are_the_next_tokens_and_ignore_padding():
    b = _batches([5, 17, 3])
    x, y = b.get(torch.tensor([0, 1, 2]))
    assert x.shape == y.shape == (3, 32)  # longest 17, rounded up to 16
    for r, n in enumerate([5, 17, 3]):
        assert torch.equal(y[r, : n - 1], x[r, 1:n])
        assert (y[r, n - 1:] == IGNORE).all()
    assert int((y != IGNORE).sum()) == (5 - 1) + (17 - 1) + (3 - 1) == b.tokens()
    x, _ = b.get(torch.tensor([0, 2]))
    assert x.shape[1] == 16


def test_batch_length_never_exceeds_seq():
    b = _batches([40, 2], seq=40)
    x, y = b.get(torch.tensor([0, 1]))
    assert x.shape[1] == 40 and y[0, 38] == x[0, 39] and y[0, 39] == IGNORE


class _Logits(nn.Module):
    """Zero logits, except garbage wherever the input token is padding."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, input_ids):
        z = torch.zeros(*input_ids.shape, self.vocab)
        junk = torch.randn(*input_ids.shape, self.vocab) * 30
        return SimpleNamespace(logits=torch.where((input_ids == PAD)[..., None], junk, z))


def test_uniform_predictions_give_the_vocabulary_size_padding_excluded():
    # Uniform logits: every predicted token has NLL log(V), so the perplexity is V exactly.
    # Predictions made from padding positions are garbage; were they counted, it would not be.
    vocab = 30
    b = _batches([5, 17, 3, 9, 40, 2])
    ppl, nll, n = perplexity(_Logits(vocab), b, "cpu", contextlib.nullcontext(), bs=4)
    assert n == b.tokens()
    assert nll == pytest.approx(math.log(vocab), rel=1e-6)
    assert ppl == pytest.approx(vocab, rel=1e-6)


def test_rotten_tomatoes_lm_split_is_fixed_and_disjoint():
    d = rotten_tomatoes_lm()
    assert (len(d.train), len(d.test)) == (10202, 2550)
    assert not set(d.train) & set(d.test)
    assert d.vocab == 30522 and d.pad_id == PAD
    a, b = d.subset(100, 50), d.subset(100, 50)
    assert a.train == b.train and a.test == b.test and len(a.train) == 100
    assert set(a.test) <= set(d.test)
    v = d.encode("test", 64)
    x, y = v.get(torch.arange(8))
    cls, sep = d.tokenizer.cls_token_id, d.tokenizer.sep_token_id
    assert (x[:, 0] == cls).all()
    assert all(x[i, v.lengths[i] - 1] == sep for i in range(8))
    assert "rotten-tomatoes-lm" in LM_DATASETS
    assert load_dataset("rotten-tomatoes-lm", train_size=10, test_size=5).kind == "lm"


def test_exported_files_give_the_same_data_without_the_wheels(tmp_path):
    d = rotten_tomatoes_lm()
    root = export_lm_files(tmp_path / "rt")
    e = rotten_tomatoes_lm(str(root))
    assert e.train == d.train and e.test == d.test and e.vocab == d.vocab
    assert torch.equal(e.encode("test", 64).ids, d.encode("test", 64).ids)
    assert load_dataset("rotten-tomatoes-lm", str(root)).test == d.test
    with pytest.raises(FileExistsError, match="not empty"):  # never overwrites
        export_lm_files(root)
    with pytest.raises(DataUnavailableError, match="export_lm_files"):
        rotten_tomatoes_lm(str(tmp_path))
