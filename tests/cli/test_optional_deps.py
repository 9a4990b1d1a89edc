"""The base install (no cli extra): without matplotlib the figures are skipped with a note and
the results are still written; without tqdm progress is plain lines on stderr."""

import json
import sys

import pytest

from hot.cli import common

TINY = ["--dataset", "mnist-5k", "--train-size", 128, "--test-size", 64, "--batch-size", 64,
        "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu", "--method", "fp32"]


@pytest.fixture
def no_matplotlib(monkeypatch):
    for m in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails


@pytest.fixture
def no_tqdm(monkeypatch):
    for m in [m for m in sys.modules if m == "tqdm" or m.startswith("tqdm.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, "tqdm", None)
    from hot.common.options import override

    with override(progress=True):
        yield


def test_train_without_matplotlib_writes_results_and_skips_the_plot(run_text, no_matplotlib,
                                                                    tmp_path):
    rc, out, err = run_text("train", *TINY, "--out", tmp_path, "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["plot"] is None and res["steps"] == 2
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 2
    assert (tmp_path / "metrics.csv").exists() and not (tmp_path / "curves.png").exists()
    notes = [ln for ln in err.splitlines() if "matplotlib" in ln]
    assert len(notes) == 1 and notes[0].startswith("note: ") and "curves.png" in notes[0]


def test_memory_without_matplotlib_skips_the_chart(run_text, no_matplotlib, tmp_path):
    rc, out, err = run_text("memory", "tiny-vit", "--batch", 2, "--vit-dim", 32,
                            "--vit-depth", 1, "--device", "cpu", "--out", tmp_path)
    assert rc == 0, err
    assert "matplotlib" in err and not (tmp_path / "memory.png").exists()
    assert "plot:" not in out


def test_progress_without_tqdm_is_plain_lines(no_tqdm, capsys):
    bar = common.progress(["a", "b", "c"], "epoch 1/1")
    seen = []
    for x in bar:
        seen.append(x)
        bar.set_postfix(loss="0.5")
    assert seen == ["a", "b", "c"]
    assert capsys.readouterr().err == "epoch 1/1: 3/3, loss=0.5\n"
    # A line at most every every_s seconds while iterating: 0 s gives one per item.
    list(common.PlainProgress(iter(range(2)), "eval", every_s=0))
    assert capsys.readouterr().err == "eval: 1\neval: 2\n"


def test_progress_setting_is_read_through_one_function(no_tqdm, monkeypatch, capsys):
    from hot.common.options import from_env, override

    items = [1, 2]
    assert from_env({"HOT_NO_PROGRESS": "1"}).progress is False
    with override(progress=False):
        assert not common.progress_enabled()
        assert common.progress(items, "x") is items
    monkeypatch.setattr(common, "progress_enabled", lambda: False)
    assert common.progress(items, "x") is items
    assert capsys.readouterr().err == ""


def test_train_without_tqdm_reports_progress_lines(run_text, no_tqdm, tmp_path):
    rc, _, err = run_text("train", *TINY, "--no-plot", "--out", tmp_path)
    assert rc == 0, err
    assert "fp32 epoch 1/1: 2/2, loss=" in err
    assert "fp32 eval: 1/1" in err
