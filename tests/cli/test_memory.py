"""Saved-for-backward bytes: measured with hooks vs the analytic model derived here."""

import math

import pytest

import torch
import torch.nn as nn

from hot.analysis.saved import OTHER, SavedTensorMeter

TOKENS = 50  # tiny-vit on 28x28 with 4x4 patches: 49 patches + CLS


def fp32_bytes(L, I):
    return 4 * L * I  # the fp32 input x


def hot_bytes(L, I, r=8, drawn=True):
    # int8 HLA coefficients + one fp32 scale per channel (+ the forward's 8-byte step with
    # HOTConfig()'s drawn rows on a Linear layer)
    return math.ceil(L / 16) * r * I + 4 * I + 8 * drawn


def test_memory_per_layer_matches_formula(run_cli, tmp_path):
    b, dim = 4, 32
    rc, d = run_cli("memory", "tiny-vit", "--batch", b, "--vit-dim", dim, "--vit-depth", 1,
                    "--methods", "fp32,bf16,hot,hot-bf16", "--device", "cpu", "--out", tmp_path)
    assert rc == 0
    assert (tmp_path / "memory.png").stat().st_size > 1000
    m = d["methods"]
    L = b * TOKENS
    expect = {  # layer: (rows, input features)
        "patch_embed": (b * 49, 16), "blocks.0.attn.qkv": (L, dim), "blocks.0.attn.proj": (L, dim),
        "blocks.0.fc1": (L, dim), "blocks.0.fc2": (L, 2 * dim), "head": (b, dim)}
    for name, (rows, i) in expect.items():
        assert m["fp32"]["layers"][name]["measured"] == fp32_bytes(rows, i), name
        assert m["hot"]["layers"][name]["measured"] == hot_bytes(rows, i), name
        assert m["hot"]["layers"][name]["analytic"] == hot_bytes(rows, i), name
        # under autocast too: the codes alone, no cast copy of W
        for part in ("measured", "analytic"):
            assert m["hot-bf16"]["layers"][name][part] == hot_bytes(rows, i), (name, part)
    tot32 = sum(fp32_bytes(*v) for v in expect.values())
    tothot = sum(hot_bytes(*v) for v in expect.values())
    assert m["fp32"]["measured_saved_linear"] == tot32
    assert m["hot"]["measured_saved_linear"] == tothot
    # 4 bytes -> 1 byte and 16 rows -> 8: close to 8x, less for the scales and row padding.
    assert 7.0 < tot32 / tothot < 8.0
    assert m["bf16"]["measured_saved_linear"] < tot32
    assert m["fp32"]["analytic"]["weights"] == 4 * d["params"]


class _TwiceSaved(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return (y * y).sum() + (y[:, :4] * 2).sum()  # y saved by mul (twice); a view of y too


def test_meter_counts_each_storage_once_and_skips_parameters():
    m = _TwiceSaved()
    x = torch.randn(5, 8)
    with SavedTensorMeter(m) as meter:
        loss = m(x)
    # lin saves x (not requires_grad here, but F.linear saves it for g_W) and its Parameters
    # (excluded); mul saves y twice (one storage). The slice's mul by a constant saves nothing.
    assert meter.by_layer["lin"] == 5 * 8 * 4
    assert meter.by_layer[OTHER] == 5 * 8 * 4
    loss.backward()


def test_conv_abc_keeps_im2col_rows_so_3x3_saves_more_than_fp32():
    import hot

    b, c, h = 2, 4, 8  # 3x3, stride 1, padding 1: L = b*h*h output rows, I = 9c
    conv = nn.Sequential(nn.Conv2d(c, 8, 3, padding=1))
    x = torch.randn(b, c, h, h, requires_grad=True)
    with SavedTensorMeter(conv) as m32:
        conv(x).sum()
    hot.convert(conv, hot.HOTConfig())
    with SavedTensorMeter(conv) as mh:
        conv(x).sum()
    L, i = b * h * h, 9 * c
    assert m32.by_layer["0"] == 4 * b * c * h * h  # fp32 keeps x itself
    assert mh.by_layer["0"] == math.ceil(L / 16) * 8 * i + 4 * i  # int8 HLA rows of the patches
    assert mh.by_layer["0"] > m32.by_layer["0"]  # 9/8 of fp32 plus the scales


def test_memory_leads_with_totals_and_says_when_hot_keeps_more(run_cli, run_text, tmp_path):
    args = ["memory", "tiny-vit", "--batch", 4, "--vit-dim", 32, "--vit-depth", 1,
            "--methods", "fp32,bf16,hot", "--device", "cpu", "--no-plot"]
    rc, d = run_cli(*args)
    assert rc == 0
    tot = {m: r["measured_saved_total"] for m, r in d["methods"].items()}
    for m in tot:
        for b in ("fp32", "bf16"):
            assert d["comparison"][m][b] == tot[m] / tot[b]
    # At this size the other ops (fp32 under HOT, bf16 under autocast) outweigh HOT's
    # compressed layer inputs: HOT keeps more than bf16 in all, less than fp32.
    assert tot["fp32"] > tot["hot"] > tot["bf16"]
    more = [s for s in d["summary"] if "MORE than" in s]
    assert len(more) == 1 and more[0].startswith("So hot keeps MORE than bf16")
    rc, out, _ = run_text(*args)
    assert rc == 0
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["method", "saved", "for"]  # the totals table comes first
    assert out.index("hot keeps MORE than bf16") < out.index("Per layer:")
    more_pct, less_pct = tot["hot"] / tot["bf16"] - 1, 1 - tot["hot"] / tot["fp32"]
    assert f"({more_pct:.0%} MORE)" in out and f"({less_pct:.0%} less)" in out
    # a CPU has no allocator trace: no peak, no section that would claim one
    assert all(r["at_peak"] is None for r in d["methods"].values())
    assert "Where the GPU peak goes" not in out


@pytest.mark.gpu
def test_memory_on_a_gpu_says_where_the_peak_goes(run_cli, run_text):
    args = ["memory", "tiny-vit", "--batch", 64, "--vit-dim", 64, "--vit-depth", 2,
            "--methods", "bf16,hot", "--device", "cuda", "--backend", "fast", "--no-plot"]
    rc, d = run_cli(*args)
    assert rc == 0
    for m, r in d["methods"].items():
        p = r["at_peak"]
        live = p["live_GiB"]
        # the shares are the peak's bytes (each rounded to 1e-3 GiB)
        assert abs(sum(live.values()) - p["peak_GiB"]) <= 1e-3 * len(live), m
        # the peak above what was allocated before the step is the allocator's own
        assert abs(p["peak_GiB"] - live["before the step"]
                   - r["peak_forward_backward_bytes"] / 2**30) <= 2e-3, m
        assert p["peak_GiB"] > live["before the step"] > 0, m
    # HOT's operators (hot.nn, its backends) allocate what is live at HOT's peak (the codes);
    # none runs under bf16 (the model's own code, hot/models, is not one of them)
    ops = ("hot/nn/", "hot/fast/", "hot/reference/", "hot/common/")
    assert any(o.startswith(ops) for o in d["methods"]["hot"]["at_peak"]["live_GiB"])
    assert not any(o.startswith(ops) for o in d["methods"]["bf16"]["at_peak"]["live_GiB"])
    rc, out, _ = run_text(*args)
    assert rc == 0 and "Where the GPU peak goes" in out
    assert out.count(": peak ") == 2


def test_compare_totals_says_more_only_where_hot_keeps_more():
    from hot.cli.memory import compare_totals

    def r(linear, other):
        return {"measured_saved_linear": linear, "measured_saved_other": other,
                "measured_saved_total": linear + other}

    res = {"fp32": r(400, 600), "bf16": r(200, 300), "hot": r(50, 400)}
    comparison, summary = compare_totals(res)
    assert comparison["hot"] == {"fp32": 0.45, "bf16": 0.9}
    assert summary == ["hot keeps 450 B for backward in all: 0.45x fp32's 1000 B (55% less), "
                       "0.90x bf16's 500 B (10% less)."]
    res["hot"] = r(50, 550)
    _, summary = compare_totals(res)
    assert len(summary) == 2 and "1.20x bf16's 500 B (20% MORE)" in summary[0]
    assert summary[1].startswith("So hot keeps MORE than bf16: it compresses only what "
                                 "Linear/Conv layers save (50 B against bf16's 200 B), and the "
                                 "other ops (attention, norms, activations) keep 550 B against "
                                 "bf16's 300 B.")
    _, summary = compare_totals({"hot": r(50, 550)})
    assert "no exact baseline was measured" in summary[0]


def test_memory_of_a_llama_preset_with_shared_codes(run_cli, tmp_path):
    """A Llama preset runs on random tokens with its next-token loss. Under --hla-share
    siblings, k/v and up read their source's input (q, gate) and keep nothing of their own,
    measured and in the model; o reads another tensor and keeps its own codes."""
    b, t, d, ffn, vocab = 2, 32, 128, 512, 1000
    rc, out = run_cli("memory", "llama-tiny", "--batch", b, "--seq-len", t, "--vocab", vocab,
                      "--methods", "bf16,hot", "--hla-share", "siblings", "--device", "cpu",
                      "--no-plot", "--out", tmp_path)
    assert rc == 0
    L = b * t
    bf16, h = out["methods"]["bf16"]["layers"], out["methods"]["hot"]["layers"]
    a = "model.layers.0."
    assert bf16[a + "self_attn.q_proj"]["measured"] == 2 * L * d + 2 * d * d  # x, autocast's W
    for name in ("self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj"):
        assert h[a + name]["measured"] == h[a + name]["analytic"] == 0, name
    for name, i in (("self_attn.q_proj", d), ("self_attn.o_proj", d), ("mlp.gate_proj", d),
                    ("mlp.down_proj", ffn)):
        assert h[a + name]["measured"] == h[a + name]["analytic"] == hot_bytes(L, i), name
    assert h["lm_head"]["measured"] == hot_bytes(L, d)
    assert all(v["measured"] == v["analytic"] for v in h.values())
    # every layer once: 4 blocks of 7 and the head
    assert len(h) == 29
