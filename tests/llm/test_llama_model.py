"""hot.models.llama: the decoder's shapes, causality, presets and argument checks."""

import pytest
import torch
import torch.nn as nn

pytest.importorskip("transformers")

import hot
from hot.models.llama import (LLAMA_PRESETS, LlamaSpecError, llama_decoder, llama_param_count,
                              llama_preset)
from hot.models.registry import ModelError, build_lm, build_model

SMALL = dict(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=50, seq=24)


def test_llama_1b_preset_has_its_shape_and_about_1_1b_parameters():
    m = llama_preset("llama-1b", device="meta")  # allocates nothing
    c = m.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,
            c.intermediate_size, c.vocab_size, c.max_position_embeddings) == \
        (2048, 16, 16, 8, 8192, 32000, 2048)
    n = sum(p.numel() for p in m.parameters())
    assert n == llama_param_count(**LLAMA_PRESETS["llama-1b"])
    assert 1.05e9 < n < 1.2e9
    assert c._attn_implementation == "sdpa" and not c.tie_word_embeddings and not c.use_cache
    assert m.lm_head.weight is not m.model.embed_tokens.weight


def test_param_count_formula_matches_the_built_model_with_and_without_gqa():
    for kv in (None, 2, 1):
        m = llama_decoder(**{**SMALL, "kv_heads": kv})
        assert sum(p.numel() for p in m.parameters()) == \
            llama_param_count(**{**SMALL, "kv_heads": kv})


def test_decoder_is_causal_and_seeded():
    torch.manual_seed(3)
    a = llama_decoder(**SMALL)
    torch.manual_seed(3)
    b = llama_decoder(**SMALL)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    ids = torch.randint(0, 50, (2, 20))
    later = ids.clone()
    later[:, 12:] = (later[:, 12:] + 1) % 50  # change only tokens 12..19
    with torch.no_grad():
        la, lb = a(input_ids=ids).logits, a(input_ids=later).logits
    assert la.shape == (2, 20, 50)
    assert torch.equal(la[:, :12], lb[:, :12])  # no position sees a later token
    assert not torch.equal(la[:, 12:], lb[:, 12:])


def test_hot_converts_every_linear_of_the_decoder():
    m = llama_decoder(**SMALL)
    linears = sum(isinstance(x, nn.Linear) for x in m.modules())
    assert linears == 7 * SMALL["layers"] + 1  # q k v o gate up down per layer, lm_head
    hot.convert(m, convert_head=True, backend="reference")
    assert len(hot.hot_layers(m)) == linears


@pytest.mark.parametrize("kw, word", [
    (dict(heads=3), "heads=3"),          # 32 is not a multiple of 3
    (dict(heads=32), "heads=32"),        # head size 1: no rotary pairs
    (dict(kv_heads=3), "kv_heads=3"),    # does not divide 4 query heads
    (dict(vocab=0), "vocab=0"),
    (dict(layers=1.5), "layers=1.5"),
])
def test_bad_shapes_name_the_argument(kw, word):
    with pytest.raises(LlamaSpecError, match=word.replace(".", r"\.")):
        llama_decoder(**{**SMALL, **kw})


def test_presets_need_a_known_name_and_tiny_needs_a_vocabulary():
    with pytest.raises(LlamaSpecError, match="llama-7b"):
        llama_preset("llama-7b")
    with pytest.raises(LlamaSpecError, match="vocab=len"):
        llama_preset("llama-tiny")
    m = llama_preset("llama-tiny", vocab=64, layers=1)
    assert (m.config.hidden_size, m.config.vocab_size, m.config.num_hidden_layers) == (128, 64, 1)


def test_registry_builds_lm_presets_and_refuses_them_as_classifiers():
    b = build_lm("llama-tiny", vocab=40, seq=16, pad_id=0, overrides={"layers": 1})
    assert b.kind == "lm" and b.model.config.pad_token_id == 0
    assert b.model.config.max_position_embeddings == 16
    with pytest.raises(ModelError, match="rotten-tomatoes-lm"):
        build_model("llama-tiny", classes=2)
    with pytest.raises(ModelError, match="Llama preset"):
        build_lm("tiny-vit", vocab=40, seq=16)
