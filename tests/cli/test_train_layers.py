"""hot train's per-layer choices: --hla-full-rank (HLA off on named layers), --lora-hot (which
LoRA layers run HOT), and models that take one input size only."""

import pytest
import torch.nn as nn

import hot
from hot.recipes import RECIPES
from hot.cli.trainer import lora_filter

TINY = ["--dataset", "mnist-5k", "--train-size", 128, "--test-size", 64, "--batch-size", 64,
        "--vit-dim", 32, "--vit-depth", 2, "--max-steps", 1, "--epochs", 1, "--device", "cpu",
        "--no-plot"]


def test_hla_full_rank_sets_rank_16_on_the_named_layers_only(run_cli, tmp_path):
    rc, d = run_cli("train", *TINY, "--hla-full-rank", "attn", "--out", tmp_path / "r")
    assert rc == 0
    ranks = d["hla_rank"]
    attn = {n for n in ranks if "attn" in n}
    assert attn and len(attn) < len(ranks)
    assert all(ranks[n] == 16 for n in attn)
    assert all(r == 8 for n, r in ranks.items() if n not in attn)
    # The share of the paper's saving: (1 - r/16) * size summed, over (1/2) * size summed.
    from hot.models import build_model

    m = build_model("tiny-vit", classes=10, input_shape=(1, 28, 28), vit_dim=32,
                    vit_depth=2).model
    sizes = {n: mod.weight.numel() for n, mod in m.named_modules()
             if isinstance(mod, (nn.Linear, nn.Conv2d))}
    want = sum((1 - ranks[n] / 16) * s for n, s in sizes.items()) / (0.5 * sum(sizes.values()))
    assert d["hla_rank_share"] == pytest.approx(want, rel=1e-12)
    assert 0 < d["hla_rank_share"] < 1


def test_hla_full_rank_refusals(run_text, run_cli, tmp_path):
    rc, out, err = run_text("train", *TINY, "--hla-full-rank", "nosuchlayer", "--out",
                            tmp_path / "a")
    assert rc == 2 and "'nosuchlayer' names no HOT layer" in err
    rc, d = run_cli("train", *TINY, "--hla-full-rank", "nosuchlayer,attn", "--out",
                    tmp_path / "a2")
    assert rc == 0 and d["hla_rank"]["blocks.0.attn.qkv"] == 16
    assert not (tmp_path / "a" / "metrics.json").exists()
    rc, out, err = run_text("train", *TINY, "--method", "int4", "--hla-full-rank", "attn",
                            "--out", tmp_path / "b")
    assert rc == 2 and "--hla-full-rank" in err and "method int4 has its own" in err
    rc, out, err = run_text("train", *TINY, "--hla-full-rank", " , ", "--out", tmp_path / "c")
    assert rc == 2 and "names no layer" in err


def test_lora_hot_needs_lora_r(run_text, tmp_path):
    rc, out, err = run_text("train", *TINY, "--lora-hot", "both", "--out", tmp_path / "a")
    assert rc == 2 and "--lora-hot both" in err and "--lora-r" in err


def test_lora_filter_picks_the_frozen_base_the_factors_or_both():
    peft = pytest.importorskip("peft")

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(32, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(self.fc1(x))

    def converted(which):
        m = peft.get_peft_model(Net(), peft.LoraConfig(r=4, target_modules=["fc1"]))
        RECIPES["hot"].prepare(m, hot.HOTConfig(), lora_filter(which), None)  # as hot train does
        return sorted(n.rsplit(".", 1)[0] if n.endswith(".default") else n
                      for n, _ in hot.hot_layers(m))

    base = "base_model.model.fc1"
    assert converted("frozen") == [f"{base}.base_layer"]
    assert converted("adapters") == [f"{base}.lora_A", f"{base}.lora_B"]
    assert converted("both") == [f"{base}.base_layer", f"{base}.lora_A", f"{base}.lora_B"]


def test_a_timm_model_fixed_to_one_input_size_names_the_size(run_text, tmp_path):
    pytest.importorskip("timm")
    rc, out, err = run_text("train", "--model", "efficientformer_l1", *TINY,
                            "--out", tmp_path / "a")
    assert rc == 2
    assert "takes only 224x224 images" in err and "--image-size 224" in err
    assert "bug" not in err


def test_recommended_preset():
    cfg = hot.HOTConfig.recommended(exact_steps=938)
    assert cfg == hot.HOTConfig.paper().replace(exact_steps=938)
    assert cfg.exact_at(937) and not cfg.exact_at(938)
    for bad in (-1, 1.5, True, None):
        with pytest.raises(hot.HOTConfigError, match="recommended"):
            hot.HOTConfig.recommended(exact_steps=bad)
