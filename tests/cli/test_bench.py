"""`hot bench layer|step|gpus`: each benchmark reached from the hot command with its arguments
unchanged; the end-to-end step runs on the CPU."""

import argparse
import importlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import hot
from hot.bench import e2e
from hot.bench.argparser import BenchParser

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
    monkeypatch.setattr("hot.bench.e2e.main", lambda *a, **kw: pytest.fail("the benchmark ran"))
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
    monkeypatch.setattr(f"{module}.main", lambda a, usage_error: got.append(a) or 0)
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


# A bad argument of each benchmark's own parser: (name, module, argv, what the message says).
BAD_ARGUMENTS = [
    ("layer", "hot.bench.backward", ["--shapes", "nope"],
     "argument --shapes: 'nope' is no shape group; give a comma list of vitb, llama."),
    ("step", "hot.bench.e2e", ["--device", "cpu", "--model", "vit-c"],
     "argument --model: invalid choice: 'vit-c'"),
    ("gpus", "hot.bench.distributed", ["--device", "tpu"],
     "argument --device: invalid choice: 'tpu'"),
]
# Its refusal of an existing --json PATH: (name, module, argv before --json, from argparse?).
# The distributed benchmark checks its options after parsing (OptionsError), in one line.
EXISTING_JSON = [("layer", "hot.bench.backward", [], True),
                 ("step", "hot.bench.e2e", ["--device", "cpu"], True),
                 ("gpus", "hot.bench.distributed", ["--device", "cpu"], False)]


def run_module(module, argv, capsys):
    """What `python -m MODULE ARGV` runs (sys.exit(main())): (exit status, stdout, stderr)."""
    try:
        rc = importlib.import_module(module).main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("name, module, argv, needle", BAD_ARGUMENTS)
def test_a_bad_benchmark_argument_under_hot_and_on_its_own(run_text, monkeypatch, capsys, name,
                                                           module, argv, needle):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # layer's GPU check passes
    rc, out, err = run_text("bench", name, *argv)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "usage" not in err
    assert err.startswith(f"hot bench {name}: error: {needle}")
    rc, out, err = run_module(module, argv, capsys)  # argparse's usage block, then its error
    assert rc == 2 and out == "" and err.startswith("usage: ")
    assert f"error: {needle}" in err.splitlines()[-1]


@pytest.mark.parametrize("name, module, argv, from_argparse", EXISTING_JSON)
def test_an_existing_json_path_under_hot_and_on_its_own(run_text, monkeypatch, capsys, tmp_path,
                                                        name, module, argv, from_argparse):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    path = tmp_path / "old.json"
    path.write_text("kept")
    rc, out, err = run_text("bench", name, *argv, "--json", path)
    assert rc == 2 and out == "" and err.count("\n") == 1 and "usage" not in err
    assert err.startswith(f"hot bench {name}: error: --json {path}") and "new path" in err
    rc, out, err = run_module(module, [*argv, "--json", str(path)], capsys)
    assert rc == 2 and out == "" and err.startswith("usage: ") == from_argparse
    assert f"error: --json {path}" in err.splitlines()[-1] and "new path" in err
    assert path.read_text() == "kept"


def test_python_m_keeps_argparses_own_output():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-m", "hot.bench.backward", "--shapes", "nope"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and r.stdout == ""
    usage, error = r.stderr.splitlines()
    assert usage.startswith("usage: ") and "--shapes SHAPES" in usage
    assert error.endswith("error: argument --shapes: 'nope' is no shape group; give a comma list "
                          "of vitb, llama.")


def test_argparse_itself_is_never_replaced(run_text, monkeypatch):
    # The hot command turns a benchmark's argparse errors into its one-line errors through the
    # parser it hands the benchmark, not by swapping argparse's error() for the whole process.
    original, seen = argparse.ArgumentParser.error, []
    parse = argparse.ArgumentParser.parse_known_args

    def spy(self, *args, **kwargs):
        seen.append((type(self), argparse.ArgumentParser.error))
        return parse(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", spy)
    rc, _, err = run_text("bench", "step", "--device", "cpu", "--model", "vit-c")
    assert rc == 2 and "'vit-c'" in err
    assert seen[-1][0] is BenchParser  # the hot command's parses, then the benchmark's
    assert all(error is original for _, error in seen), seen
    assert argparse.ArgumentParser.error is original


def test_a_bench_parsers_subcommands_raise_the_given_error():
    class Refused(Exception):
        pass

    p = BenchParser(prog="bench", usage_error=Refused)
    p.add_subparsers(dest="cmd").add_parser("run").add_argument("--n", type=int)
    with pytest.raises(Refused, match="argument --n: invalid int value: 'x'"):
        p.parse_args(["run", "--n", "x"])
    with pytest.raises(Refused, match="argument --n: expected one argument"):
        p.parse_args(["run", "--n"])


@pytest.mark.parametrize("recipe", ["hot", "paper"])
def test_layer_benchmark_stage_args_are_the_layers(recipe):
    """The per-layer benchmark times each backward stage with the arguments a Linear layer runs
    with: HLAConfig.selection "auto" and HQConfig.bits "auto" resolved (the quantizers refuse
    "auto"), a drawn selection given its draw. Each stage runs on the reference backend here."""
    from hot.bench.backward import stage_args
    from hot.common import ops
    from hot.common.config import DRAWN_SELECTIONS, hq_bits

    from hot.recipes import get

    cfg = get(recipe).config
    a = stage_args(cfg, True, "cpu")
    run = cfg.for_layer(conv=False)
    assert a.hla.selection == run.hla.selection != "auto"
    assert (a.hla.draw is not None) == (run.hla.selection in DRAWN_SELECTIONS)
    assert a.hq.bits == a.hq_w.bits == hq_bits(run.hq.bits, "cpu") and a.hla.rank == run.hla.rank
    g = torch.randn(64, 48, dtype=torch.bfloat16)
    (qg, _), (qh, _) = ops.gy_quantize(g, a.hq, a.hla, "reference")
    assert qg.shape == (64, 48) and qh.shape == (48, 64 // 16 * run.hla.rank)
    assert ops.hq_quantize(torch.randn(32, 48).t(), a.hq_w, "reference").q.shape == (48, 32)
    assert ops.hla_quantize(torch.randn(64, 32), a.hla_x, "reference").q.shape == (32, 32)
