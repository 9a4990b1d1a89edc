"""The command line fits users' habits: one help formatter, help on every option, no
abbreviations, suggestions for typos, plain progress in logs, --threads, --hot-config FILE,
--compile and --exclude."""

import argparse
import io
import json
import re
import sys

import pytest
import torch

from hot.cli import common
from hot.cli.main import build_parser

TINY = ["--dataset", "mnist-5k", "--train-size", 128, "--test-size", 64, "--batch-size", 64,
        "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu", "--no-plot", "--epochs", 1]


def subparsers():
    return build_parser()._subparsers._group_actions[0].choices.items()


def test_every_option_has_help_and_states_its_default_once():
    for name, sub in subparsers():
        fmt = sub._get_formatter()
        for a in sub._actions:
            assert a.help and a.help != argparse.SUPPRESS, (name, a.option_strings)
            text = fmt._get_help_string(a).replace("%(default)s", "")
            assert len(re.findall(r"\bdefault\b", text)) <= 1, (name, text)
        assert "{'" not in sub.format_help()  # no dict printed (demo --smoke)


def test_no_abbreviations_and_suggestions(run_text):
    rc, _, err = run_text("train", "--epoch", 2)
    assert rc == 2 and "unrecognized arguments: --epoch" in err
    rc, _, err = run_text("train", "--dataset", "fashion-mnsit")
    assert rc == 2 and "did you mean 'fashion-mnist'" in err and err.count("\n") == 1
    rc, _, err = run_text("memory", "--methods", "hto")
    assert rc == 2 and "did you mean 'hot'" in err


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(monkeypatch):
    from hot.common.options import override

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with override(progress=True):
        bar = common.progress(range(3), "epoch 1/1")
        assert isinstance(bar, common.PlainProgress)
        list(bar)
    assert sys.stderr.getvalue() == "epoch 1/1: 3/3\n"


def test_default_threads(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cores, want in ((1, 1), (2, 1), (3, 3), (16, 4)):
        monkeypatch.setattr(common.os, "sched_getaffinity", lambda _: set(range(cores)))
        assert common.default_threads() == want
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert common.default_threads() == 3


def test_threads_flag_sets_torchs_threads(run_cli, tmp_path):
    before = torch.get_num_threads()
    try:
        rc, _ = run_cli("train", *TINY, "--method", "fp32", "--threads", 3, "--out", tmp_path / "r")
        assert rc == 0 and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_hot_config_file_reaches_every_field_and_flags_override_it(tmp_path, run_text):
    import hot

    cfg = hot.HOTConfig(hq=hot.HQConfig(w_rounding="nearest"), hla=hot.HLAConfig(rank=4),
                        lqs=hot.LQSConfig(ratio=0.25, calibration_steps=3), min_in_features=32)
    f = tmp_path / "cfg.json"
    f.write_text(json.dumps(cfg.to_dict()))
    args = build_parser().parse_args(["train", "--hot-config", str(f)])
    assert common.hot_config(args) == cfg
    # rank 16: neither the file's nor HOTConfig()'s (selection auto takes ranks 4, 8 and 16)
    args = build_parser().parse_args(["train", "--hot-config", str(f), "--hla-rank", "16",
                                      "--hq-bits", "none"])
    assert common.hot_config(args) == cfg.replace(hla={"rank": 16}, hq={"bits": None})
    assert common.hot_config(build_parser().parse_args(["train"])) == hot.HOTConfig()
    f.write_text('{"hla": {"rank": 3}}')
    rc, _, err = run_text("train", *TINY, "--hot-config", f, "--out", tmp_path / "o")
    assert rc == 2 and err.count("\n") == 1 and "--hot-config" in err
    rc, _, err = run_text("train", *TINY, "--method", "luq", "--hot-config", f,
                          "--out", tmp_path / "o")
    assert rc == 2 and "--hot-config" in err and not (tmp_path / "o").exists()


def test_compile_trains_through_torch_compile(run_cli, tmp_path, monkeypatch):
    seen = []

    def fake_compile(model, *a, **kw):
        seen.append(model)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    rc, res = run_cli("train", *TINY, "--method", "hot", "--compile", "--out", tmp_path / "r")
    assert rc == 0 and len(seen) == 1 and res["fingerprint"]["compile"] is True


def test_exclude_leaves_matching_layers_exact(run_cli, run_text, tmp_path):
    rc, res = run_cli("train", *TINY, "--method", "hot", "--exclude", "head,blocks.0.fc*",
                      "--out", tmp_path / "r")
    assert rc == 0 and res["lqs"]
    assert not any("head" in n or n.startswith("blocks.0.fc") for n in res["lqs"])
    assert any(n.startswith("blocks.0.attn") for n in res["lqs"])
    rc, _, err = run_text("train", *TINY, "--method", "hot", "--exclude", "nothing-like-it",
                          "--out", tmp_path / "o")
    assert rc == 2 and "--exclude nothing-like-it" in err
