"""The language-model task: train_lm (Python) and `hot train --dataset rotten-tomatoes-lm`."""

import json
import math

import pytest

pytest.importorskip("transformers")

import hot
from hot.cli.lmtrain import LMSpec, train_lm
from hot.cli.loop import lr_factor
from hot.data.lm import rotten_tomatoes_lm

# A CPU-sized decoder: the 30,522-token embedding and lm_head dominate its cost.
SMALL = {"layers": 1, "hidden": 64, "heads": 2, "ffn": 128}
FAST = dict(model_overrides=SMALL, train_size=80, val_size=32, batch_size=16, seq=32, lr=2e-2)


@pytest.fixture(scope="module")
def data():
    return rotten_tomatoes_lm()


@pytest.mark.parametrize("method", ["fp32", "hot"])
def test_perplexity_falls_below_uniform_after_a_few_steps(data, method):
    # 5 AdamW steps at lr 2e-2 learn the unigram statistics: validation perplexity drops from
    # about the vocabulary size (30,522; random init is slightly worse than uniform) to about
    # 4,000. Without training (lr 1e-9, below) it stays at the uniform baseline.
    r = train_lm(LMSpec(method=method, **FAST), "cpu", data)
    assert r["steps"] == 5 and r["uniform_ppl"] == 30522
    assert math.isfinite(r["val_ppl"]) and r["val_ppl"] < 0.5 * r["uniform_ppl"]
    assert r["val_ppl"] == pytest.approx(math.exp(r["val_nll"]))
    assert r["history"]["epochs"][-1]["val_ppl"] == r["val_ppl"]
    assert r["hot_layers"] == (8 if method.startswith("hot") else 0)
    assert "model" not in r


def test_without_training_perplexity_stays_near_uniform(data):
    r = train_lm(LMSpec(method="fp32", max_steps=2, **{**FAST, "lr": 1e-9}), "cpu", data)
    assert r["val_ppl"] > 0.95 * r["uniform_ppl"]


def test_runs_of_one_seed_are_repeatable_and_exact_layers_stay_exact(data):
    spec = LMSpec(method="hot", exact_layers=("lm_head",), max_steps=2,
                  hot_config=hot.HOTConfig(seed=1), **FAST)
    a, b = train_lm(spec, "cpu", data, keep_model=True), train_lm(spec, "cpu", data)
    assert a["history"]["step_loss"] == b["history"]["step_loss"] and a["steps"] == 2
    assert a["hot_layers"] == 7 and not isinstance(a["model"].lm_head, hot.HOTLinear)
    with pytest.raises(ValueError, match="exact_layers: 'head'"):
        train_lm(LMSpec(method="hot", exact_layers=("head",), **FAST), "cpu", data)


@pytest.mark.parametrize("field, value", [("method", "fp8"), ("epochs", 0), ("seq", 1),
                                          ("lr", float("nan")), ("val_size", 0)])
def test_bad_specs_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"LMSpec.{field}="):
        train_lm(LMSpec(**{field: value}))


def test_learning_rate_warms_up_then_decays_to_zero():
    assert [lr_factor(s, 10, 2) for s in (0, 1)] == [0.5, 1.0]
    assert lr_factor(2, 10, 2) == 1.0 and lr_factor(10, 10, 2) == pytest.approx(0.0)
    assert lr_factor(6, 10, 2) == pytest.approx(0.5)  # halfway through the cosine
    assert lr_factor(0, 10, 0) == 1.0


def test_cli_trains_a_language_model(run_cli, tmp_path):
    out = tmp_path / "lm"
    rc, d = run_cli("train", "--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm",
                    "--method", "hot-bf16", "--train-size", 32, "--test-size", 16,
                    "--batch-size", 16, "--max-len", 32, "--max-steps", 2, "--out", out)
    assert rc == 0, d
    assert d["steps"] == 2 and math.isfinite(d["val_ppl"]) and d["val_sequences"] == 16
    assert d["spec"]["seq"] == 32 and d["spec"]["hot_config"]["hq"]["bits"] == "auto"
    assert {p.name for p in out.iterdir()} == {"metrics.json", "metrics.csv", "model.pt"}
    assert json.loads((out / "metrics.json").read_text())["val_ppl"] == d["val_ppl"]
    # A second run into the same folder stops before training and leaves the results as they are.
    before = (out / "metrics.json").read_bytes()
    rc, d2 = run_cli("train", "--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm",
                     "--train-size", 32, "--test-size", 16, "--max-steps", 1, "--out", out)
    assert rc == 2 and "already holds" in d2["error"] and "--overwrite" in d2["error"]
    assert (out / "metrics.json").read_bytes() == before
    rc, d3 = run_cli("train", "--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm",
                     "--train-size", 32, "--test-size", 16, "--batch-size", 16, "--max-len", 32,
                     "--max-steps", 1, "--out", out, "--overwrite")
    assert rc == 0 and d3["steps"] == 1


@pytest.mark.parametrize("args, words", [
    (["--model", "tiny-vit", "--dataset", "rotten-tomatoes-lm"], "llama-tiny"),
    (["--model", "llama-tiny", "--dataset", "mnist-5k"], "causal language model"),
    (["--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm", "--lora-r", 4], "--lora-r"),
])
def test_cli_refuses_models_and_datasets_that_do_not_fit(run_cli, tmp_path, args, words):
    rc, d = run_cli("train", *args, "--out", tmp_path / "x")
    assert rc == 2 and words in d["error"]
