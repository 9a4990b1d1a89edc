"""Llama-style decoders (transformers' LlamaForCausalLM) built with random weights, never
downloaded: pre-norm RMSNorm blocks, rotary positions, grouped-query attention through
``F.scaled_dot_product_attention`` ('sdpa'), a SwiGLU MLP, and an untied output layer.

Every weight matrix except the token embedding is an ``nn.Linear`` (q/k/v/o projections,
gate/up/down projections, ``lm_head``), so ``hot.convert`` reaches all of them.

Presets (``LLAMA_PRESETS``):

* ``llama-1b``: hidden 2048, 16 layers, 16 heads, 8 key/value heads, FFN 8192, vocab 32000,
  seq 2048: 1,137,772,544 parameters (the attention and MLP shapes of Llama 3.2 1B with a
  32k vocabulary and untied embeddings).
* ``llama-tiny``: hidden 128, 4 layers, 4 heads, FFN 512, seq 128, for CPU tests and the
  language-model task; its vocabulary is the tokenizer's, so it has none of its own.
"""

from __future__ import annotations

from typing import Optional

import torch

from .registry import ModelError

LLAMA_PRESETS: dict[str, dict] = {
    "llama-1b": dict(hidden=2048, layers=16, heads=16, kv_heads=8, ffn=8192, vocab=32000,
                     seq=2048),
    "llama-tiny": dict(hidden=128, layers=4, heads=4, kv_heads=None, ffn=512, vocab=None,
                       seq=128),
}


class LlamaSpecError(ModelError):
    """A Llama shape argument is out of range; the message names it, its value and the fix."""


def llama_decoder(hidden: int = 2048, layers: int = 16, heads: int = 16,
                  kv_heads: Optional[int] = None, ffn: int = 8192, vocab: int = 32000,
                  seq: int = 2048, *, rope_theta: float = 10000.0, rms_eps: float = 1e-5,
                  init_std: float = 0.02, pad_id: Optional[int] = None,
                  device=None, dtype: Optional[torch.dtype] = None):
    """A randomly initialised ``transformers.LlamaForCausalLM``.

    hidden: model width; heads: query heads (head size hidden / heads, even for the rotary
    embedding); kv_heads: key/value heads (None = heads; must divide heads); ffn: SwiGLU width;
    vocab: token count of the embedding and of ``lm_head``; seq: the longest sequence (rotary
    table size). Weights are drawn from N(0, init_std^2) (transformers' initialisation, under
    the caller's torch RNG state), norms start at 1. ``tie_word_embeddings`` is False,
    attention runs through 'sdpa', and ``use_cache`` is False (training: no key/value cache).
    ``device`` builds the parameters there directly (``'meta'`` allocates nothing); ``dtype``
    None keeps float32 parameters.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    for name, v in (("hidden", hidden), ("layers", layers), ("heads", heads),
                    ("kv_heads", kv_heads), ("ffn", ffn), ("vocab", vocab), ("seq", seq)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise LlamaSpecError(f"llama_decoder: {name}={v!r} must be a positive integer.")
    if hidden % heads or (hidden // heads) % 2:
        raise LlamaSpecError(f"llama_decoder: hidden={hidden} must split into heads={heads} "
                             f"heads of an even size (rotary pairs); pick heads that divide "
                             f"hidden / 2.")
    if heads % kv_heads:
        raise LlamaSpecError(f"llama_decoder: kv_heads={kv_heads} must divide heads={heads} "
                             f"(each key/value head serves heads / kv_heads query heads).")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, max_position_embeddings=seq,
                      rms_norm_eps=rms_eps, rope_theta=rope_theta, initializer_range=init_std,
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                      pad_token_id=pad_id, bos_token_id=None, eos_token_id=None,
                      use_cache=False, attn_implementation="sdpa")
    if device is None:
        model = LlamaForCausalLM(cfg)
    else:
        with torch.device(device):
            model = LlamaForCausalLM(cfg)
    if model.config._attn_implementation != "sdpa":
        raise RuntimeError(f"transformers picked attention {model.config._attn_implementation!r}"
                           f" instead of 'sdpa'; this version of transformers is not supported.")
    return model if dtype is None else model.to(dtype)


def llama_preset(name: str, **overrides):
    """``llama_decoder`` with the shape of preset ``name`` (``LLAMA_PRESETS``), any field of
    which ``overrides`` replaces (keyword arguments of ``llama_decoder`` too, e.g. ``device``).
    A preset without a vocabulary of its own (``llama-tiny``) needs ``vocab=``."""
    if name not in LLAMA_PRESETS:
        raise LlamaSpecError(f"unknown Llama preset {name!r}: choose one of "
                             f"{sorted(LLAMA_PRESETS)}.")
    kw = {**LLAMA_PRESETS[name], **overrides}
    if kw["vocab"] is None:
        raise LlamaSpecError(f"Llama preset {name!r} takes its vocabulary from the tokenizer: "
                             f"pass vocab=len(tokenizer).")
    return llama_decoder(**kw)


def llama_param_count(hidden: int, layers: int, heads: int, kv_heads: Optional[int], ffn: int,
                      vocab: int, **_) -> int:
    """Parameters of ``llama_decoder`` with these shapes, without building it: per layer the
    q/o projections (hidden^2 each), k/v (hidden * kv_heads * head size each), the three MLP
    matrices and two RMSNorm weights; plus the embedding, the final norm and ``lm_head``."""
    kv = (heads if kv_heads is None else kv_heads) * (hidden // heads)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn + 2 * hidden
    return layers * per_layer + 2 * vocab * hidden + hidden
