import pytest
import torch
import hot

TINY = ["--train-size", 256, "--test-size", 128, "--batch-size", 64]
SMOKE = ["--train-size", 128, "--test-size", 64, "--batch-size", 64]


def test_demo_smoke(run_cli, tmp_path):
    rc, d = run_cli("demo", "--smoke", *SMOKE, "--dataset", "mnist-5k", "--device", "cpu",
                    "--out", tmp_path)
    assert rc == 0
    runs = {r["label"]: r for r in d["runs"]}
    assert set(runs) == {"fp32", "hot"}
    for r in runs.values():
        assert 0.0 <= r["test_acc"] <= 1.0
        assert r["time_per_step_s"] > 0 and r["steps"] == 2
        assert all(torch.isfinite(torch.tensor(r["history"]["step_loss"])))
    # The same seed gives the same initial loss (same init, same first batch; forward is exact).
    assert runs["fp32"]["history"]["step_loss"][0] == pytest.approx(
        runs["hot"]["history"]["step_loss"][0], rel=1e-6)
    ratio = runs["fp32"]["saved_bytes_linear"] / runs["hot"]["saved_bytes_linear"]
    assert 7.0 < ratio < 8.0  # fp32 4 bytes vs int8 on 8 of 16 rows, plus scales/padding
    assert runs["hot"]["hot_layers"] > 0 and runs["fp32"]["hot_layers"] == 0
    # The table says which backend HOT ran on (on a CPU, 'auto' resolves to the reference).
    assert runs["hot"]["hot_backend"] == "reference" and runs["fp32"]["hot_backend"] is None
    assert (tmp_path / "curves.png").stat().st_size > 1000
    assert (tmp_path / "metrics.json").exists()


def test_train_resume_continues_bit_for_bit_and_restores_lqs(run_cli, tmp_path):
    common = ["train", "--dataset", "mnist-5k", *TINY, "--vit-dim", 32, "--vit-depth", 1,
              "--method", "hot", "--device", "cpu", "--no-plot"]
    rc, full = run_cli(*common, "--epochs", 2, "--keep-checkpoints", "--out", tmp_path / "full")
    assert rc == 0
    ck_path = tmp_path / "full" / "checkpoint-epoch1.pt"  # as if the run had stopped there
    ck = torch.load(ck_path, weights_only=False)
    saved_lqs = {k[: -len(".hot_lqs")]: int(v) for k, v in ck["model"].items() if k.endswith("hot_lqs")}
    assert saved_lqs and all(v in (0, 1) for v in saved_lqs.values())  # decided after step 1
    rc, resumed = run_cli(*common, "--epochs", 2, "--out", tmp_path / "resumed",
                          "--resume", ck_path)
    assert rc == 0
    assert resumed["lqs"] == saved_lqs == full["lqs"]
    assert set(resumed["hot_steps"].values()) == {8}  # 2 epochs x 4 steps: the counter resumed
    assert resumed["history"]["step_loss"] == full["history"]["step_loss"]
    assert resumed["test_acc"] == full["test_acc"]
    assert (tmp_path / "full" / "metrics.csv").read_text().count("\n") == 3


def test_train_lora_puts_hot_on_frozen_base_layers_only(run_cli, tmp_path):
    pytest.importorskip("peft")
    rc, d = run_cli("train", "--dataset", "mnist-5k", *TINY, "--vit-dim", 32, "--vit-depth", 1,
                    "--method", "hot", "--lora-r", 4, "--max-steps", 2, "--device", "cpu",
                    "--no-plot", "--out", tmp_path)
    assert rc == 0
    assert d["lqs"] and all("base_layer" in k for k in d["lqs"])
    # patch_embed, qkv, proj, fc1, fc2 get LoRA; the head trains in full, exactly.
    assert len(d["lqs"]) == 5
    assert 0.0 <= d["test_acc"] <= 1.0


def tiny_bert_dir(tmp_path):
    """A 1-layer random BERT with the bundled MiniLM tokenizer: the HF-directory path, fast."""
    transformers = pytest.importorskip("transformers")
    from hot.models.registry import minilm_dir

    src = minilm_dir()
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64)
    d = tmp_path / "tiny-bert"
    transformers.BertForSequenceClassification(cfg).save_pretrained(d)
    transformers.AutoTokenizer.from_pretrained(str(src)).save_pretrained(d)
    return d


def test_train_hf_text_model_on_rotten_tomatoes(run_cli, tmp_path):
    model_dir = tiny_bert_dir(tmp_path)
    rc, d = run_cli("train", "--model", model_dir, "--dataset", "rotten-tomatoes",
                    "--train-size", 32, "--test-size", 16, "--batch-size", 16, "--max-len", 16,
                    "--method", "hot", "--device", "cpu", "--no-plot", "--out", tmp_path / "run")
    assert rc == 0
    assert d["steps"] == 2 and 0.0 <= d["test_acc"] <= 1.0
    # query, key, value, attention output, intermediate, output, pooler, classifier
    assert len(d["lqs"]) == 8


def test_bundled_minilm_directory_is_found():
    from hot.models.registry import minilm_dir

    d = minilm_dir()
    assert (d / "config.json").is_file() and (d / "model.safetensors").is_file()


@pytest.mark.slow
def test_train_minilm_on_rotten_tomatoes_with_lora(run_cli, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    rc, d = run_cli("train", "--model", "minilm", "--dataset", "rotten-tomatoes",
                    "--train-size", 16, "--test-size", 16, "--batch-size", 8, "--max-len", 16,
                    "--method", "hot", "--lora-r", 4, "--device", "cpu", "--no-plot",
                    "--out", tmp_path)
    assert rc == 0
    assert d["steps"] == 2 and 0.0 <= d["test_acc"] <= 1.0
    assert d["lqs"] and all("base_layer" in k for k in d["lqs"])
    assert d["trainable_params"] < d["params"] / 10  # LoRA: the base stays frozen


@pytest.mark.parametrize("method", ["int4", "luq", "lbp-wht", "hlq", "paper"])
def test_train_baselines(method, run_cli, run_text, tmp_path):
    common = ["train", "--dataset", "mnist-5k", *TINY, "--vit-dim", 32, "--vit-depth", 1,
              "--device", "cpu", "--no-plot"]
    rc, r = run_cli(*common, "--method", method, "--exact-steps", 1, "--out", tmp_path / "i4")
    assert rc == 0
    cfg = r["hot_config"]
    assert cfg == hot.recipes.get(method).config.replace(exact_steps=1).to_dict()
    assert r["hot_layers"] > 0 and set(r["hot_steps"].values()) == {r["steps"]}
    rc, out, err = run_text(*common, "--method", method, "--hla-rank", 4, "--out", tmp_path / "x")
    assert rc == 2 and "--hla-rank" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
