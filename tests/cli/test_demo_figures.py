"""`hot demo` runs again into its own folder, its table says what its ratio is, and the figures
lead with totals, group layers, label a lone epoch and draw bars from 0 with error bars."""

import json

import pytest

from hot.cli import plots

pytest.importorskip("matplotlib")


def test_demo_reruns_into_its_own_folder_only(run_text, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # `make demo` twice
        rc, out, err = run_text("demo", "--smoke", "--device", "cpu")
        assert rc == 0, err
    assert "runs" in json.loads((tmp_path / "hot_demo_out" / "metrics.json").read_text())
    assert "x less)" in out and "/method" not in out  # the saving beside the bytes
    rc, _, _ = run_text("demo", "--smoke", "--device", "cpu", "--out", "mine")
    rc, _, err = run_text("demo", "--smoke", "--device", "cpu", "--out", "mine")
    assert rc == 2 and "--overwrite" in err  # a folder the user named is never replaced
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "metrics.json").write_text('{"test_acc": 0.9}')  # not a demo's results
    monkeypatch.chdir(other.parent)
    monkeypatch.setattr("hot.cli.demo.DEMO_OUT", "elsewhere")
    rc, _, err = run_text("demo", "--smoke", "--device", "cpu")
    assert rc == 2 and "already holds metrics.json" in err


@pytest.fixture
def figures(monkeypatch):
    """The figures drawn, instead of saved."""
    drawn = []
    monkeypatch.setattr(plots, "save", lambda plt, fig, path: drawn.append(fig))
    return drawn


def test_layer_groups():
    assert plots.layer_group("blocks.11.attn.qkv") == "blocks.*.attn.qkv"
    assert plots.layer_group("layer1.0.conv1") == "layer1.*.conv1"
    assert plots.layer_group("head") == "head"


def test_memory_figure_totals_first_and_grouped(figures, tmp_path):
    layers = [f"blocks.{b}.{n}" for b in range(12) for n in ("attn.qkv", "attn.proj", "fc1",
                                                              "fc2")] + ["head"]
    series = {m: [float(2**20 * (i % 4 + 1)) for i in range(len(layers))]
              for m in ("fp32", "bf16", "hot")}
    plots.memory_bars(layers, series, tmp_path / "m.png", "vit")
    fig = figures[0]
    totals, groups = fig.axes
    assert fig.get_size_inches()[1] * 110 < 1000  # not one row per layer
    assert [t.get_text() for t in totals.get_yticklabels()] == ["fp32", "bf16", "hot"]
    assert len(groups.get_yticklabels()) == 5  # four block roles + head


def test_one_epoch_curve_is_labelled(figures, tmp_path):
    run = {"label": "hot", "history": {"step_loss": [2.0, 1.5],
                                       "epochs": [{"step": 2, "test_acc": 0.5}]}}
    plots.curves([run], tmp_path / "c.png", "t")
    acc = figures[0].axes[1]
    assert [t.get_text() for t in acc.texts] == ["hot 50.00%"]


def test_compare_bars_start_at_zero_with_error_bars(figures, tmp_path):
    rows = [{"setting": "fp32", "mean": 80.4, "sd": 0.5}, {"setting": "hot", "mean": 79.5,
                                                          "sd": 0.4}]
    plots.method_bars(rows, tmp_path / "b.png", "accuracy")
    ax = figures[0].axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > 80.9
    from matplotlib.container import BarContainer, ErrorbarContainer

    kinds = {type(c) for c in ax.containers}
    assert BarContainer in kinds and ErrorbarContainer in kinds
