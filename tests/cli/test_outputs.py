"""Run folders: nothing is written before there is something to write, an earlier run's results
are never replaced without --overwrite, a finished --resume writes nothing, and a bad --resume
file is a one-line error."""

import shutil

import pytest
import torch

from run_folders import TINY, snapshot


def copy_of(finished, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(finished, d)
    return d


@pytest.mark.parametrize("bad", [["--epochs", 0], ["--epochs", -1], ["--max-steps", -1]])
def test_invalid_numbers_leave_an_earlier_run_untouched(run_text, finished, tmp_path, bad):
    d = copy_of(finished, tmp_path)
    before = snapshot(d)
    rc, _, err = run_text("train", *TINY, "--method", "fp32", "--out", d, *bad)
    assert rc == 2 and f"argument {bad[0]}" in err
    assert snapshot(d) == before


def test_a_new_run_into_a_finished_folder_is_refused_until_overwrite(run_text, run_cli,
                                                                     finished, tmp_path):
    d = copy_of(finished, tmp_path)
    before = snapshot(d)
    rc, _, err = run_text("train", *TINY, "--method", "fp32", "--epochs", 1, "--out", d)
    assert rc == 2 and err.count("\n") == 1
    assert "metrics.json" in err and "--overwrite" in err and f"--out {d}" in err
    assert snapshot(d) == before
    rc, res = run_cli("train", *TINY, "--method", "fp32", "--epochs", 1, "--out", d,
                      "--overwrite")
    assert rc == 0 and res["steps"] == 2
    assert (d / "metrics.csv").read_text().count("\n") == 2  # header + the one new epoch


def test_resuming_a_finished_run_says_so_and_writes_nothing(run_text, run_cli, finished,
                                                            tmp_path):
    d = copy_of(finished, tmp_path)
    before = snapshot(d)
    ck = d / "checkpoint.pt"
    rc, res = run_cli("train", *TINY, "--method", "fp32", "--epochs", 2, "--out", d,
                      "--resume", ck)
    assert rc == 0 and res["status"] == "already complete" and res["written"] == []
    assert res["epochs_done"] == 2 and res["steps"] == 4
    assert snapshot(d) == before
    # Also when its output folder would be a new one: nothing is created.
    rc, out, err = run_text("train", *TINY, "--method", "fp32", "--epochs", 2,
                            "--out", tmp_path / "elsewhere", "--resume", ck)
    assert rc == 0 and "already complete" in out and "nothing was written" in out
    assert not (tmp_path / "elsewhere").exists()


def test_an_unfinished_run_is_pointed_to_resume_and_then_continues(run_text, run_cli, finished,
                                                                   tmp_path):
    d = tmp_path / "stopped"
    d.mkdir()
    shutil.copy(finished / "checkpoint-epoch1.pt", d / "checkpoint.pt")  # stopped after epoch 1
    before = snapshot(d)
    rc, _, err = run_text("train", *TINY, "--method", "fp32", "--epochs", 2, "--out", d)
    assert rc == 2 and f"--resume {d / 'checkpoint.pt'}" in err
    assert snapshot(d) == before
    rc, res = run_cli("train", *TINY, "--method", "fp32", "--epochs", 2, "--out", d,
                      "--resume", d / "checkpoint.pt")
    assert rc == 0 and res["steps"] == 4
    full = torch.load(finished / "checkpoint.pt", weights_only=True)
    assert res["history"]["step_loss"] == full["history"]["step_loss"]  # bit for bit
    assert torch.load(d / "checkpoint.pt", weights_only=True)["epoch"] == 1


def test_no_folder_is_created_when_training_fails_before_the_first_checkpoint(run_text,
                                                                              tmp_path):
    # lr 1e30 blows the weights up on the first update; the loss is non-finite by step 2, long
    # before the first epoch (and its checkpoint) ends.
    rc, _, err = run_text("train", *TINY, "--train-size", 640, "--method", "fp32", "--lr", 1e30,
                          "--out", tmp_path / "run")
    assert rc == 2 and "diverged" in err and "--lr" in err
    assert not (tmp_path / "run").exists()


def test_bad_resume_files_are_one_line_errors(run_text, finished, tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint\n" * 10)
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    cases = [(tmp_path / "missing.pt", "no such file", ["--method", "fp32"]),
             (garbage, "torch.load cannot read it", ["--method", "fp32"]),
             (foreign, "not a hot train checkpoint", ["--method", "fp32"]),
             (finished / "checkpoint-epoch1.pt", "method (recorded 'fp32', now 'hot')",
              ["--method", "hot"]),
             (finished / "checkpoint-epoch1.pt", "vit_dim (recorded 32, now 64)",
              ["--method", "fp32", "--vit-dim", 64])]
    for path, why, extra in cases:
        rc, _, err = run_text("train", *TINY, *extra, "--epochs", 2, "--out", tmp_path / "run",
                              "--resume", path)
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert f"--resume {path}" in err and why in err, err
        assert not (tmp_path / "run").exists()


def test_demo_and_memory_refuse_to_replace_results(run_text, tmp_path):
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "memory.png").write_bytes(b"png")
    rc, _, err = run_text("demo", "--smoke", "--dataset", "mnist-5k", "--device", "cpu",
                          "--out", tmp_path)
    assert rc == 2 and "metrics.json" in err and "--overwrite" in err
    rc, _, err = run_text("memory", "tiny-vit", "--batch", 2, "--vit-dim", 32, "--vit-depth", 1,
                          "--device", "cpu", "--out", tmp_path)
    assert rc == 2 and "memory.png" in err and "--overwrite" in err
    assert (tmp_path / "metrics.json").read_text() == "{}"
    assert (tmp_path / "memory.png").read_bytes() == b"png"


def test_a_failed_write_leaves_the_previous_file(tmp_path):
    from hot.cli import outputs

    f = tmp_path / "metrics.json"
    f.write_text("previous")

    def half_then_fail(tmp):
        with open(tmp, "w") as fh:
            fh.write("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        outputs.atomic(f, half_then_fail)
    assert f.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temporary left
    outputs.write_text(f, "new")
    assert f.read_text() == "new"
