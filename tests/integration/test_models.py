"""HOT on the model families users bring: timm ViT, a HuggingFace BERT with peft LoRA, a CNN."""

import pytest
import torch
import torch.nn as nn

import hot
from hot.nn import HOTConv2d, HOTLinear


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def test_timm_vit_exact_config_matches_autograd():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                            num_classes=10, depth=2).double()
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                              patch_size=8, num_classes=10, depth=2).double()
    model.load_state_dict(ref.state_dict())
    hot.convert(model, hot.HOTConfig.exact(), backend="reference")
    kinds = {type(m) for m in model.modules()}
    assert HOTLinear in kinds and HOTConv2d in kinds  # blocks and the patch-embedding conv
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 10, (3,))
    for m in (ref, model):
        nn.functional.cross_entropy(m(x), y).backward()
    g_ref, g_hot = _grads(ref), _grads(model)
    assert g_ref.keys() == g_hot.keys()
    for k in g_ref:
        # float64 throughout; the orthonormal transforms add O(1e-15) relative rounding.
        torch.testing.assert_close(g_hot[k], g_ref[k], rtol=1e-9, atol=1e-12, msg=k)


def test_timm_vit_paper_config_trains_a_step():
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              num_classes=10, depth=2)
    hot.convert(model, backend="reference")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    nn.functional.cross_entropy(model(x), y).backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n
    opt.step()
    decided = [m.hot_lqs_value() for _, m in hot.hot_layers(model)]
    assert all(d in (0, 1) for d in decided)  # every layer calibrated on its first backward


def test_peft_lora_hot_on_frozen_base_only():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=64,
                                  max_position_embeddings=32, num_labels=2)
    model = transformers.BertForSequenceClassification(cfg)
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                           modules_to_save=["classifier"])
    model = peft.get_peft_model(model, lora)
    hot.convert(model, filter=lambda fqn, m: fqn.endswith("base_layer"), backend="reference")
    converted = [n for n, _ in hot.hot_layers(model)]
    assert converted and all(n.endswith("base_layer") for n in converted)
    for _, m in hot.hot_layers(model):
        assert not m.weight.requires_grad  # HOT sits on the frozen base weights

    saved = []

    def pack(t):
        saved.append(t)
        return t

    ids = torch.randint(0, 100, (2, 16))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(input_ids=ids, labels=torch.tensor([0, 1]))
    out.loss.backward()
    lora_grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert lora_grads and all(g is not None and torch.isfinite(g).all() for g in lora_grads)
    # A frozen base layer keeps no ABC copy: nothing int8 was saved for backward.
    assert not any(t.dtype == torch.int8 for t in saved)


def test_cnn_with_depthwise_and_pointwise(caplog):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 16, 1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    with caplog.at_level("INFO", logger="hot"):
        hot.convert(model, backend="reference")
    assert any("groups=8" in r.getMessage() for r in caplog.records)
    assert isinstance(model[0], HOTConv2d) and model[0].bias is None
    assert type(model[3]) is nn.Conv2d  # depthwise stays standard
    assert isinstance(model[4], HOTConv2d) and isinstance(model[8], HOTLinear)
    x = torch.randn(2, 3, 12, 12)
    nn.functional.cross_entropy(model(x), torch.tensor([1, 3])).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_torch_compile_keeps_fresh_rounding_each_step():
    # Under torch.compile a HOT layer must still draw new seeds and advance its state per call.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8))
    hot.convert(model, backend="reference")
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(64, 32)
    grads = []
    for _ in range(3):
        model.zero_grad()
        compiled(x).square().sum().backward()
        grads.append(model[0].weight.grad.clone())
    assert model[0].hot_step_value() == 3
    assert not torch.equal(grads[1], grads[2])
