"""`hot bench layer|step|gpus`: each benchmark reached from the hot command with its arguments
unchanged; the end-to-end step runs on the CPU."""

import argparse
import json
import math

import pytest
import torch

from hot.bench import e2e

# One bf16 step of the smallest decoder on a few tokens: seconds on one CPU core.
TINY_STEP = ["step", "--device", "cpu", "--model", "llama-tiny", "--modes", "bf16", "--steps", 1,
             "--warmup", 0, "--in-process", "--seq", 16, "--batch", 1]


def check_record(r):
    assert r["mode"] == "bf16" and r["model"] == "llama-tiny" and r["device"] == "cpu"
    assert (r["batch"], r["seq"]) == (1, 16) and "error" not in r
    assert math.isfinite(r["step_ms"]) and r["step_ms"] > 0 and len(r["losses"]) == 1
    # A randomly initialised LM predicts every token nearly uniformly: loss ~ ln(vocabulary).
    assert abs(r["loss"] - math.log(e2e.BENCH_VOCAB)) < 0.5, r["loss"]


def test_step_on_cpu_writes_its_record(run_text, tmp_path):
    path = tmp_path / "step.json"
    rc, out, err = run_text("bench", *TINY_STEP, "--json", path)
    assert rc == 0, err
    records = json.loads(path.read_text())
    assert len(records) == 1
    check_record(records[0])
    assert json.loads(out.splitlines()[0])["step_ms"] == records[0]["step_ms"]  # printed too


def test_step_json_on_stdout_is_one_object(run_text):
    rc, out, err = run_text("bench", "--json", *TINY_STEP)
    assert rc == 0, err
    res = json.loads(out)  # the benchmark's own lines went to stderr
    assert list(res) == ["records"] and len(res["records"]) == 1
    check_record(res["records"][0])


def test_step_never_overwrites_a_record(run_text, tmp_path):
    path = tmp_path / "step.json"
    path.write_text("[]")
    rc, out, err = run_text("bench", *TINY_STEP, "--json", path)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("hot bench step: error: --json") and "new path" in err
    assert path.read_text() == "[]"
    assert "hot.cli" not in argparse.ArgumentParser.error.__module__  # argparse restored


def test_a_benchmarks_own_bad_argument_is_one_line(run_text):
    rc, out, err = run_text("bench", "step", "--device", "cpu", "--model", "vit-c")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("hot bench step: error:") and "'vit-c'" in err and "usage" not in err


def test_an_unknown_benchmark_gets_the_closest_name(run_text):
    rc, out, err = run_text("bench", "stpe", "--device", "cpu")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "'stpe'" in err and "did you mean 'step'?" in err and "layer, step, gpus" in err


@pytest.mark.parametrize("argv", [["step"], ["step", "--device", "cuda:1"],
                                  ["gpus", "--device", "cuda"], ["layer"], []])
def test_no_gpu_is_one_line_before_any_work(run_text, monkeypatch, argv):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("hot.bench.e2e.main", lambda argv: pytest.fail("the benchmark ran"))
    rc, out, err = run_text("bench", *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "CUDA GPU" in err
    assert f"the {argv[0] if argv else 'layer'} benchmark" in err


def test_a_benchmark_path_after_its_name_keeps_errors_as_text(run_text, monkeypatch):
    # --json after the benchmark's name is its own (a path): an error is text, not JSON.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, err = run_text("bench", "step", "--json", "out.json")
    assert rc == 2 and out == "" and "CUDA GPU" in err
    rc, out, err = run_text("bench", "--json", "step", "--device", "cpu", "--json", "out.json")
    assert rc == 2 and json.loads(out)["command"] == "hot bench step" and "not both" in err


def test_help_of_a_benchmark_needs_no_gpu(run_text, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out, _ = run_text("bench", "step", "--help")
    assert rc == 0 and "--modes" in out and "--find-batch" in out


@pytest.mark.parametrize("argv, module, forwarded", [
    ([], "hot.bench.backward", []),
    (["--", "--shapes", "vitb"], "hot.bench.backward", ["--shapes", "vitb"]),
    (["layer", "--shapes", "vitb"], "hot.bench.backward", ["--shapes", "vitb"]),
    (["step", "--", "--model", "llama-1b"], "hot.bench.e2e", ["--model", "llama-1b"]),
    (["gpus", "--worlds", "1", "--checks", "none"], "hot.bench.distributed",
     ["--worlds", "1", "--checks", "none"]),
])
def test_arguments_reach_the_benchmark_unchanged(run_text, monkeypatch, argv, module,
                                                 forwarded):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    got = []
    monkeypatch.setattr(f"{module}.main", lambda a: got.append(a) or 0)
    rc, _, err = run_text("bench", *argv)
    assert rc == 0, err
    assert got == [forwarded]


@pytest.mark.parametrize("flag", ["--json", "--md"])
def test_layer_never_overwrites_a_record(run_text, monkeypatch, tmp_path, flag):
    # Refused before the benchmark looks for a GPU (so this runs on the CPU too).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    path = tmp_path / "old"
    path.write_text("kept")
    rc, out, err = run_text("bench", "layer", flag, path)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"hot bench layer: error: {flag}") and "new path" in err
    assert path.read_text() == "kept"
