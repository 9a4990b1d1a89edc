"""Validation before work: paths, method lists and sizes are checked before anything trains;
failures are one line on stderr with exit status 2 (the study's too)."""

import contextlib
import io
import json

import pytest

from hot.bench import study

TINY = ["--dataset", "mnist-5k", "--train-size", 128, "--test-size", 64, "--batch-size", 64,
        "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu", "--no-plot", "--method", "fp32"]


def test_an_out_under_a_file_fails_before_training(run_text, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    rc, _, err = run_text("train", *TINY, "--out", f / "run")
    assert rc == 2 and err.count("\n") == 1
    assert f"--out {f / 'run'}" in err and "is a file" in err  # said before any epoch ran


@pytest.mark.parametrize("cmd", [["memory", "tiny-vit", "--methods", "hot,fp32,hot"],
                                 ["demo", "--methods", "fp32,fp32"],
                                 ["compare", "--methods", "fp32,hot,fp32", "--", "--epochs", 1]])
def test_a_method_listed_twice_is_refused(run_text, tmp_path, cmd):
    i = cmd.index("--") if "--" in cmd else len(cmd)
    rc, _, err = run_text(*cmd[:i], "--out", tmp_path / "o", *cmd[i:])
    assert rc == 2 and err.count("\n") == 1 and "twice" in err
    assert not (tmp_path / "o").exists()


def test_max_len_below_two_names_the_flag(run_text):
    rc, _, err = run_text("train", "--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm",
                          "--max-len", 1)
    assert rc == 2 and "--max-len" in err and "LMSpec" not in err


def test_a_failed_lm_run_leaves_no_folder(run_text, tmp_path, monkeypatch):
    from hot.cli import lmtrain

    def fail(*a, **kw):
        raise FloatingPointError("[hot] loss is nan at step 3: training diverged.")

    monkeypatch.setattr(lmtrain, "load_dataset", lambda *a, **kw: None)
    monkeypatch.setattr(lmtrain, "train_lm", fail)
    rc, _, err = run_text("train", "--model", "llama-tiny", "--dataset", "rotten-tomatoes-lm",
                          "--device", "cpu", "--out", tmp_path / "lm")
    assert rc == 2 and "diverged" in err
    assert not (tmp_path / "lm").exists()


def test_bench_without_gpu_errs_on_stderr_with_the_documented_json(run_text, run_cli,
                                                                   monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, err = run_text("bench")
    assert rc == 2 and out == "" and err.count("\n") == 1 and "CUDA GPU" in err
    rc, res = run_cli("bench")
    assert rc == 2 and set(res) == {"error", "type", "command", "exit_status"}
    assert res["command"] == "hot bench" and res["exit_status"] == 2


def run_study(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = study.main([str(a) for a in argv])
    return rc, err.getvalue()


@pytest.mark.parametrize("bad", [["--epochs", 0], ["--train-size", 0], ["--epochs", -2],
                                 ["--train-size", -5], ["--workers", 0], ["--epoch", 2]])
def test_study_refuses_bad_numbers_up_front(tmp_path, bad):
    rc, err = run_study("run", "--out", tmp_path / "s", "--tasks", "smoke", "--settings", "fp32",
                        "--seeds", 0, "--device", "cpu", *bad)
    assert rc == 2 and err.count("\n") == 1 and bad[0] in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()


def test_study_merge_reads_bad_files_in_one_line(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "dict.json").write_text(json.dumps({"task": "x"}))
    for f in (tmp_path / "missing.json", tmp_path / "bad.json", tmp_path / "dict.json"):
        rc, err = run_study("merge", f)
        assert rc == 2 and err.count("\n") == 1 and str(f) in err and "Traceback" not in err


def test_study_refuses_a_setting_listed_twice(tmp_path):
    rc, err = run_study("run", "--out", tmp_path / "s", "--tasks", "smoke", "--settings",
                        "fp32,paper,fp32", "--device", "cpu")
    assert rc == 2 and "twice" in err
