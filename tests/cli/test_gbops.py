"""GBOPs against the formulas, and against the official calculator's published ViT-B numbers
(hot_official_code.md section 7.2: numbers printed by running gbops_calculation.py, not ours)."""

import pytest

from hot.analysis import gbops as G
from hot.analysis.shapes import LayerShape

LG = 4  # log2(16)


def vitb_shapes():
    """ViT-B/16 at 224x224, batch 1, 100 classes: the (L, O, I) of every GEMM."""
    s = [LayerShape("patch_embed.proj", "conv", 196, 768, 3 * 16 * 16)]
    for b in range(12):
        s += [LayerShape(f"blocks.{b}.attn.qkv", "linear", 197, 2304, 768),
              LayerShape(f"blocks.{b}.attn.proj", "linear", 197, 768, 768),
              LayerShape(f"blocks.{b}.mlp.fc1", "linear", 197, 3072, 768),
              LayerShape(f"blocks.{b}.mlp.fc2", "linear", 197, 768, 3072)]
    return s + [LayerShape("head", "linear", 1, 100, 768)]


def hot_official(L, O, I, k=0.5):
    ops = (L * O * LG + O * I * LG + L * O + O * I + L * I * LG + L * O * LG + O * k * L
           + I * k * O + I * O + L * I)
    return (ops * 1024 + O * k * L * I * 64 + L * O * I * 16) / 1e9


def test_fp_backward_is_two_gemms_of_fp32_macs():
    s = LayerShape("x", "linear", 50, 24, 40)
    assert G.backward_counts(s, "fp").bops == 2 * 50 * 24 * 40 * 1024
    frozen = LayerShape("x", "linear", 50, 24, 40, trainable=False)
    assert G.backward_counts(frozen, "fp").bops == 50 * 24 * 40 * 1024


def test_hot_layer_matches_table5_formula():
    L, O, I, r, n = 64, 48, 32, 8, 16
    s = LayerShape("x", "linear", L, O, I)
    c = G.backward_counts(s, "hot", rank=r)
    table5_flops = (2 * L * O * LG + 2 * I * O * LG + 2 * L * O + 2 * I * O
                    + 2 * L * I * LG + 2 * L * O * LG + 2 * I * L * r / n + 2 * O * L * r / n
                    + 2 * I * O + 2 * L * I)
    assert c.fp_ops == pytest.approx(table5_flops / 2)
    assert c.int4_macs == L * O * I and c.int8_macs == O * L * r / n * I
    assert c.bops == pytest.approx(table5_flops / 2 * 1024 + L * O * I * 16 + O * L * I / 2 * 64)


def test_official_convention_differs_only_in_the_hla_term():
    s = LayerShape("qkv", "linear", 197, 2304, 768)
    t5 = G.backward_counts(s, "hot", convention="table5").bops
    off = G.backward_counts(s, "hot", convention="official").bops
    assert off - t5 == pytest.approx((768 * 0.5 * 2304 - 768 * 197 * 0.5) * 1024)


def test_vitb_totals_reproduce_the_official_calculator():
    t = G.table(vitb_shapes(), convention="official")["total_gbops"]
    macs = sum(s.L * s.O * s.I for s in vitb_shapes())
    assert t["forward"] == pytest.approx(macs * 1024 / 1e9)
    assert t["fp_backward"] == pytest.approx(2 * macs * 1024 / 1e9)
    hot = sum(hot_official(s.L, s.O, s.I) for s in vitb_shapes())
    assert t["hot_backward"] == pytest.approx(hot)
    # Published by the official script (two decimals):
    assert round(t["forward"], 2) == 17252.16
    assert round(t["fp_backward"], 2) == 34504.31
    assert round(t["hot_backward"], 2) == 1604.72
    assert round(t["lbp_wht_backward"], 2) == 8746.30
    assert round(t["luq_backward"], 2) == 1733.87
    qkv = G.backward_counts(LayerShape("qkv", "linear", 197, 2304, 768), "hot", convention="official")
    assert round(qkv.bops / 1e9, 2) == 33.70


def test_cli_gbops_on_timm_vit_reads_shapes_with_hooks(run_cli):
    pytest.importorskip("timm")
    rc, d = run_cli("gbops", "vit_tiny_patch16_224", "--classes", 100, "--convention", "official")
    assert rc == 0
    layers = {r["layer"]: r for r in d["layers"]}
    assert len(layers) == 1 + 12 * 4 + 1
    q = layers["blocks.0.attn.qkv"]
    assert (q["L"], q["O"], q["I"]) == (197, 3 * 192, 192)
    assert q["hot_bwd_gbops"] == pytest.approx(hot_official(197, 576, 192))
    pe = layers["patch_embed.proj"]
    assert (pe["L"], pe["O"], pe["I"]) == (196, 192, 3 * 16 * 16)
    macs = 196 * 192 * 768 + 12 * 197 * 192 * (576 + 192 + 768 + 768) + 192 * 100
    assert d["total_gbops"]["fp32_backward"] == pytest.approx(2 * macs * 1024 / 1e9)


def test_cli_gbops_columns_are_recipes_with_their_own_rank(run_cli, run_text):
    """Each --methods column is the recipe's counting model at the recipe's HLA rank; --rank
    overrides it; a recipe without a counting model is refused before any work."""
    args = ("gbops", "tiny-vit", "--vit-dim", 32, "--vit-depth", 1)
    rc, d = run_cli(*args, "--methods", "fp32,hot,hlq,lbp-wht")
    assert rc == 0
    assert d["methods"]["hot"] == {"model": "hot", "rank": 8, "forward_bits": None}
    tot = d["total_gbops"]
    assert tot["hlq_backward"] == tot["hot_backward"]  # the same GEMMs and quantizers
    rc, d4 = run_cli(*args, "--methods", "hot", "--rank", 4)
    assert rc == 0 and d4["methods"]["hot"]["rank"] == 4
    assert d4["total_gbops"]["hot_backward"] < tot["hot_backward"]
    rc, _, err = run_text(*args, "--methods", "int4")
    assert rc == 2 and "int4" in err and err.count("\n") == 1


def test_quantized_forward_counts_hq_of_x_and_w_then_the_int8_gemm():
    """HOTConfig(forward="int8"), counted as Table 5 counts HQ: the transforms of x (L x I) and
    W (O x I) along I, their quantization, the dequantized output, and L O I INT8 MACs."""
    L, O, I = 64, 48, 32
    s = LayerShape("x", "linear", L, O, I)
    c = G.forward_counts(s, 8)
    flops = 2 * L * I * LG + 2 * O * I * LG + 2 * L * I + 2 * O * I + 2 * L * O
    assert c.fp_ops == pytest.approx(flops / 2) and c.int8_macs == L * O * I
    assert c.bops == pytest.approx(flops / 2 * 1024 + L * O * I * 64)
    assert G.forward_counts(s).bops == L * O * I * 1024  # exact: FP32 MACs
    with pytest.raises(ValueError, match="8 bits"):
        G.forward_counts(s, 4)


def test_cli_gbops_counts_the_forward_of_a_recipe_that_quantizes_it(run_cli, run_text):
    """hot-q's column has its own forward (its recipe's F operands: INT8); its backward is
    hot's. Methods with an exact forward share the fwd column."""
    args = ("gbops", "tiny-vit", "--vit-dim", 32, "--vit-depth", 1, "--methods", "fp32,hot,hot-q")
    rc, d = run_cli(*args)
    assert rc == 0
    methods = d["methods"]
    assert methods["hot-q"]["forward_bits"] == 8 and methods["hot"]["forward_bits"] is None
    tot = d["total_gbops"]
    assert tot["hot-q_backward"] == tot["hot_backward"] and "hot_forward" not in tot
    want = sum(G.forward_counts(LayerShape(r["layer"], "linear", r["L"], r["O"], r["I"]), 8).bops
               for r in d["layers"]) / 1e9
    assert tot["hot-q_forward"] == pytest.approx(want) and tot["hot-q_forward"] < tot["forward"]
    rc, text, _ = run_text(*args[:-2], "--methods", "fp32,hot-q")
    assert rc == 0 and "hot-q fwd" in text and "forward + backward" in text


def test_gbops_of_a_llama_preset_counts_every_token(run_cli):
    rc, d = run_cli("gbops", "llama-tiny", "--batch", 2, "--seq-len", 16)
    assert rc == 0
    layers = {r["layer"]: r for r in d["layers"]}
    assert len(layers) == 29 and {r["L"] for r in layers.values()} == {32}
    assert layers["lm_head"]["O"] == 32000  # llama-tiny's synthetic vocabulary (LM_VOCAB)
