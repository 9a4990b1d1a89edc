"""Runs that know their task: a run folder records a fingerprint of what determines its result;
`hot train --resume`, `hot compare` and the study reuse a run only when it matches, and refuse
otherwise (one line naming the differing fields and --overwrite, exit 2)."""

import json
import shutil

import pytest

from hot.bench import study
from hot.cli import fingerprint

from run_folders import TINY, snapshot


def test_metrics_and_checkpoint_record_the_fingerprint(finished):
    import torch

    import hot

    fp = json.loads((finished / "metrics.json").read_text())["fingerprint"]
    assert fp["method"] == "fp32" and fp["epochs"] == 2 and fp["train_size"] == 128
    # the config recorded is HOTConfig() unresolved ("auto" widths): the device is beside it
    assert fp["device"] == "cpu" and fp["hot_config"] == json.loads(
        json.dumps(hot.HOTConfig().to_dict()))
    assert fp["code"]["version"]
    ck = torch.load(finished / "checkpoint.pt", weights_only=True)
    assert ck["fingerprint"] == fp


@pytest.mark.parametrize("change, field", [(["--method", "hot"], "method"),
                                          (["--method", "fp32", "--lr", "0.01"], "lr"),
                                          (["--method", "fp32", "--train-size", "96"],
                                           "train_size")])
def test_resuming_a_run_of_another_task_is_refused(run_text, finished, tmp_path, change, field):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    before = snapshot(d)
    args = [a for a in TINY if a not in ("--train-size", 128)] if field == "train_size" else TINY
    # A finished checkpoint ("already complete") and an unfinished one: both are refused.
    for ck in ("checkpoint.pt", "checkpoint-epoch1.pt"):
        rc, out, err = run_text("train", *args, *change, "--epochs", 2, "--out", d,
                                "--resume", d / ck)
        assert rc == 2 and err.count("\n") == 1, (out, err)
        assert f"{field} (recorded" in err and "--overwrite" in err
    assert snapshot(d) == before


def test_overwrite_starts_a_mismatching_resume_over(run_cli, finished, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    rc, res = run_cli("train", *TINY, "--method", "fp32", "--lr", "0.01", "--epochs", 1,
                      "--out", d, "--resume", d / "checkpoint.pt", "--overwrite")
    assert rc == 0 and res["steps"] == 2 and res["fingerprint"]["lr"] == 0.01


def test_a_checkpoint_without_fingerprint_is_not_reused(run_text, finished, tmp_path):
    import torch

    ck = torch.load(finished / "checkpoint.pt", weights_only=True)
    del ck["fingerprint"]
    torch.save(ck, tmp_path / "old.pt")
    rc, _, err = run_text("train", *TINY, "--method", "fp32", "--epochs", 2,
                          "--out", tmp_path / "o", "--resume", tmp_path / "old.pt")
    assert rc == 2 and "no fingerprint" in err and not (tmp_path / "o").exists()


TASK = ["--", "--dataset", "mnist-5k", "--train-size", 128, "--test-size", 64,
        "--vit-dim", 32, "--vit-depth", 1, "--epochs", 1]


def test_compare_refuses_runs_of_another_task_until_overwrite(run_text, tmp_path):
    out = tmp_path / "cmp"
    rc, text, _ = run_text("compare", "--methods", "fp32", "--seeds", "0", "--out", out, *TASK)
    assert rc == 0 and "1 to run" in text
    metrics = out / "compare" / "fp32" / "seed0" / "metrics.json"
    before = metrics.read_bytes()
    other = [*TASK, "--lr", "0.01"]
    rc, text, err = run_text("compare", "--methods", "fp32", "--seeds", "0", "--out", out,
                             *other)
    assert rc == 2 and err.count("\n") == 1 and "lr (recorded None, now 0.01)" in err
    assert "--overwrite" in err and metrics.read_bytes() == before
    rc, text, _ = run_text("compare", "--methods", "fp32", "--seeds", "0", "--out", out,
                           "--overwrite", *other)
    assert rc == 0 and "1 to run" in text
    assert json.loads(metrics.read_text())["fingerprint"]["lr"] == 0.01
    # The same command again: the matching run is reused.
    rc, text, _ = run_text("compare", "--methods", "fp32", "--seeds", "0", "--out", out, *other)
    assert rc == 0 and "0 to run" in text


def test_compare_tables_only_the_seeds_asked_for(run_text, tmp_path):
    out = tmp_path / "cmp"
    rc, _, _ = run_text("compare", "--methods", "fp32", "--seeds", "0,1", "--out", out, *TASK)
    assert rc == 0
    rc, _, _ = run_text("compare", "--methods", "fp32", "--seeds", "1", "--out", out, *TASK)
    rows = json.loads((out / "compare.json").read_text())
    assert rc == 0 and rows[0]["seeds"] == [1]


def test_study_cell_with_another_fingerprint_is_stale(tmp_path):
    cell = study.Cell(study.TASKS["smoke"], study.SETTINGS["fp32"], 0, tmp_path, 1)
    assert study.stale_cells([cell], "cpu", None) == {}  # nothing recorded: a new cell
    expect = fingerprint.of_command(cell.command("cpu", None)[3:])
    cell.out.mkdir(parents=True)
    (cell.out / "metrics.json").write_text(json.dumps({"fingerprint": expect}))
    assert study.stale_cells([cell], "cpu", None) == {}
    (cell.out / "metrics.json").write_text(json.dumps({"fingerprint": {**expect, "epochs": 3}}))
    assert "epochs (recorded 3, now 1)" in study.stale_cells([cell], "cpu", None)[cell]
    with pytest.raises(study.StudyError, match="--overwrite"):
        study.run_cells([cell], 1, "cpu", None, say=lambda _: None)
    assert "--overwrite" in cell.command("cpu", None, fresh=True)
