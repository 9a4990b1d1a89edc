"""The docs/huggingface.md recipes: a converted MiniLM trains with the HF Trainer and with
accelerate (full fine-tuning and LoRA on frozen bases), saves with save_pretrained and loads with
from_pretrained without a foreign or missing key, and gives the same logits after reloading."""

import logging
import warnings

import pytest
import torch

import hot
from hot.data.base import DataUnavailableError

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def minilm():
    from hot.models.registry import minilm_dir
    from hot.data.text import rotten_tomatoes

    try:
        path, data = minilm_dir(), rotten_tomatoes()
    except DataUnavailableError as e:
        pytest.skip(str(e))
    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    texts, labels = zip(*data.train[:24])
    enc = tok(list(texts), padding="max_length", truncation=True, max_length=32, return_tensors="pt")
    rows = [{"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
             "labels": torch.tensor(labels[i])} for i in range(len(labels))]
    return str(path), rows


@pytest.fixture
def load_reports(caplog):
    """What transformers and peft log or warn while loading (their LOAD REPORT tables)."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            yield lambda: [r.getMessage() for r in caplog.records] + [str(x.message) for x in w]
    finally:
        hf_logging.disable_propagation()


def _classifier(path):
    torch.manual_seed(0)
    return transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)


def _logits(model, rows):
    batch = {k: torch.stack([r[k] for r in rows[:8]]) for k in ("input_ids", "attention_mask")}
    model.eval()
    with torch.no_grad():
        return model(**batch).logits


def _key_trouble(msgs):
    return [m for m in msgs if any(w in m.lower() for w in ("unexpected", "missing", "hot_"))]


def test_trainer_fine_tunes_a_converted_model_that_reloads_without_foreign_keys(
        minilm, tmp_path, load_reports):
    path, rows = minilm
    model = hot.convert(_classifier(path), backend="reference")
    before = model.bert.encoder.layer[0].attention.self.query.weight.detach().clone()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=8,
        learning_rate=1e-4, save_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=True, seed=0)
    transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    layers = dict(hot.hot_layers(model))
    assert "classifier" not in layers  # the output head stays exact
    assert all(m.hot_step_value() == 3 for m in layers.values())  # HOT ran in every step
    assert not torch.equal(model.bert.encoder.layer[0].attention.self.query.weight, before)
    assert any(k.endswith("hot_step") for k in model.state_dict())  # resume keeps HOT's state

    model.save_pretrained(tmp_path / "saved")
    from safetensors.torch import load_file

    assert not [k for k in load_file(tmp_path / "saved" / "model.safetensors") if "hot_" in k]
    before = len(load_reports())  # (loading the bundled encoder reports its new classifier)
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "saved")
    assert _key_trouble(load_reports()[before:]) == []
    assert torch.equal(_logits(reloaded, rows), _logits(model, rows))


def test_accelerate_trains_lora_on_frozen_hot_bases_and_the_adapter_reloads(
        minilm, tmp_path, load_reports):
    peft = pytest.importorskip("peft")
    accelerate = pytest.importorskip("accelerate")
    path, rows = minilm
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"],
                           modules_to_save=["classifier"], task_type="SEQ_CLS")
    model = hot.convert(peft.get_peft_model(_classifier(path), lora), backend="reference")
    s = hot.summary(model)
    assert all(".lora_" not in n for n in s.converted) and len(s.left["LoRA adapter"]) == 24
    assert all(not m.weight.requires_grad for _, m in hot.hot_layers(model))

    acc = accelerate.Accelerator(cpu=True)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loader = torch.utils.data.DataLoader(rows, batch_size=8)
    model, opt, loader = acc.prepare(model, opt, loader)
    model.train()
    for batch in loader:
        acc.backward(model(**batch).loss)
        opt.step()
        opt.zero_grad()
    # HOT ran in each step on the frozen layers that need a g_x (those below the first adapter
    # need none: nothing upstream of them trains, so they run the plain op).
    steps = {m.hot_step_value() for _, m in hot.hot_layers(model)}
    assert steps == {0, 3}
    acc.unwrap_model(model).save_pretrained(tmp_path / "adapter")

    base = _classifier(path)  # (its fresh classifier is reported missing: the adapter has it)
    before = len(load_reports())
    reloaded = peft.PeftModel.from_pretrained(base, tmp_path / "adapter")
    assert _key_trouble(load_reports()[before:]) == []
    assert torch.equal(_logits(reloaded, rows), _logits(acc.unwrap_model(model), rows))
