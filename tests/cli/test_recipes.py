"""The recipe registry: one vocabulary of methods that every tool of the hot command reads."""

import math

import pytest

import hot
from hot import recipes
from hot.cli.main import build_parser

TINY_VIT = ("tiny-vit", "--batch", 4, "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu")
TOKENS = 50  # tiny-vit on 28x28 with 4x4 patches: 49 patches + CLS


def test_registered_recipes_and_their_configs():
    assert recipes.names()[:9] == ["fp32", "bf16", "hot", "hot-bf16", "paper", "hlq", "int4",
                                   "luq", "lbp-wht"]
    r = recipes.RECIPES
    assert r["fp32"].config is None and r["bf16"].autocast is not None
    assert r["hot"].config == hot.HOTConfig() and r["hot"].tunable
    assert r["paper"].config == hot.HOTConfig.paper() and not r["paper"].tunable
    for name, preset in (("hlq", "hlq"), ("int4", "int4"), ("luq", "luq"),
                         ("lbp-wht", "lbp_wht")):
        assert r[name].config == getattr(hot.HOTConfig, preset)()
    assert hot.Recipe is recipes.Recipe and hot.RECIPES is recipes.RECIPES


def test_gemms_are_read_from_the_config():
    g = recipes.get("paper").gemms
    assert (g.D.bits, g.D.transform, g.D.rank) == (4, "hadamard16", None)
    assert (g.W.bits, g.W.transform, g.W.rank, g.W.selection) == (8, "walsh16", 8, "lowpass")
    assert g.F.bits is None and "int8 codes" in g.saves
    g = recipes.get("hot").gemms  # HOTConfig(): the width and the rows chosen per GPU and layer
    assert (g.D.bits, g.W.selection) == ("auto", "auto")
    assert g.D.describe().startswith("int4/8 (auto") and "intauto" not in g.D.describe()
    cfg = hot.HOTConfig().replace(hq={"bits": 8}, hla={"rank": 4, "abc": "save"})
    g = recipes.gemms(cfg)
    assert (g.D.bits, g.W.rank) == (8, 4) and g.saves.startswith("T x as int8 codes (4 of 16")
    assert recipes.get("luq").gemms.D.levels == "log2"
    assert recipes.get("int4").gemms.W.transform is None  # full rank, no transform
    g = recipes.get("hot-q").gemms  # the forward GEMM quantized too (hot.nn.forward)
    assert (g.F.bits, g.F.transform, g.F.rounding) == (8, "hadamard16", "nearest")
    assert recipes.get("hot-q").config == hot.HOTConfig.quantized()
    assert recipes.get("hot-q-bf16").autocast is not None
    lbp = recipes.get("lbp-wht").gemms
    assert (lbp.D.bits, lbp.D.transform, lbp.D.rank, lbp.D.selection) == (None, "walsh16", 8,
                                                                         "lp_l1")
    assert recipes.get("bf16").gemms.D.describe() == "exact (bf16)"


def test_get_names_the_value_the_choices_and_the_closest():
    with pytest.raises(recipes.RecipeError) as e:
        recipes.get("hql")
    msg = str(e.value)
    assert "'hql'" in msg and "did you mean 'hlq'" in msg and "lbp-wht" in msg


@pytest.mark.parametrize("bad", ["", "Hot", "a,b", "a b", "hot"])
def test_register_refuses_names_the_tools_cannot_take(bad):
    with pytest.raises(recipes.RecipeError, match="name|already"):
        recipes.register(recipes.Recipe(bad, "x"))


@pytest.fixture
def throwaway():
    """A recipe registered by the test alone: HOT at HLA rank 4, with HOT's cost models."""
    r = recipes.register(recipes.Recipe(
        "throwaway", "a recipe only this test registers", hot.HOTConfig(hla=hot.HLAConfig(rank=4)),
        cost=recipes.Cost(gbops="hot", memory="hot")))
    yield r
    del recipes.RECIPES[r.name]


def test_a_new_recipe_reaches_every_tool_without_editing_them(throwaway, run_cli, tmp_path):
    p = build_parser()  # built after registration, as the hot command builds it per call
    assert p.parse_args(["train", "--method", "throwaway"]).method == "throwaway"
    assert p.parse_args(["compare", "--methods", "fp32,throwaway", "--out", "x"]).methods == \
        ["fp32", "throwaway"]
    assert p.parse_args(["memory", "tiny-vit", "--methods", "throwaway"]).methods == \
        ["throwaway"]
    assert p.parse_args(["gbops", "tiny-vit", "--methods", "throwaway"]).methods == \
        ["throwaway"]
    from hot.bench import study

    assert study.recipe_setting("throwaway").flags == ("--method", "throwaway")
    assert study.all_settings()["throwaway"].flags == ("--method", "throwaway")
    from hot.bench import e2e

    mode = e2e.parse_mode("throwaway_compile")
    assert mode.recipe.name == "throwaway" and mode.hot and mode.compile == "default"
    rc, g = run_cli("gbops", *TINY_VIT[:-2], "--methods", "hot,throwaway")
    assert rc == 0
    assert g["methods"]["throwaway"] == {"model": "hot", "rank": 4, "forward_bits": None}
    assert g["total_gbops"]["throwaway_backward"] < g["total_gbops"]["hot_backward"]
    rc, m = run_cli("memory", *TINY_VIT, "--methods", "throwaway", "--no-plot")
    assert rc == 0 and m["methods"]["throwaway"]["hot_config"]["hla"]["rank"] == 4
    qkv = m["methods"]["throwaway"]["layers"]["blocks.0.attn.qkv"]
    # rank-4 codes, one scale per channel, and the 8-byte step of HOTConfig()'s drawn rows
    assert qkv["analytic"] == math.ceil(4 * TOKENS / 16) * 4 * 32 + 4 * 32 + 8
    rc, t = run_cli("train", "--method", "throwaway", "--dataset", "mnist-5k", "--train-size", 64,
                    "--test-size", 32, "--batch-size", 32, "--vit-dim", 32, "--vit-depth", 1,
                    "--max-steps", 1, "--device", "cpu", "--no-plot", "--out", tmp_path / "t")
    assert rc == 0 and set(t["hla_rank"].values()) == {4}


def test_memory_measures_each_method_with_its_own_config(run_cli):
    """int4 and luq keep x itself (their codes are formed in backward), as fp32 does; HOT keeps
    its compressed codes. Measuring every method with HOT's configuration hid that."""
    rc, d = run_cli("memory", *TINY_VIT, "--methods", "fp32,hot,int4,luq,lbp-wht", "--no-plot")
    assert rc == 0
    m = d["methods"]
    fp32 = m["fp32"]["measured_saved_linear"]
    for name in ("int4", "luq"):  # x, and per layer a few bytes of state (a step snapshot)
        assert fp32 <= m[name]["measured_saved_linear"] < 1.01 * fp32
    assert m["hot"]["measured_saved_linear"] < fp32 / 7
    for name in ("int4", "luq", "lbp-wht"):
        assert m[name]["hot_config"] == recipes.get(name).config.to_dict()
    assert m["int4"]["analytic"]["activations_linear"] is None  # no analytic model: none shown


def test_quantizer_flags_are_refused_for_a_recipe_with_its_own(run_text):
    rc, _, err = run_text("memory", *TINY_VIT, "--methods", "hot,int4", "--hla-rank", 4,
                          "--no-plot")
    assert rc == 2 and err.count("\n") == 1
    assert "--hla-rank" in err and "int4" in err and "hot, hot-bf16" in err


def test_unknown_method_suggests_the_closest(run_text):
    rc, _, err = run_text("memory", *TINY_VIT, "--methods", "fp32,hql")
    assert rc == 2 and err.count("\n") == 1 and "did you mean 'hlq'" in err
