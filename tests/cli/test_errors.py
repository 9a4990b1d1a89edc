"""Every failure of the `hot` command: exit status 2, one line on stderr that names the option,
the value and the fix (an option the subcommand has), a JSON error object with --json, and no
traceback; unexpected exceptions point to --debug; Ctrl-C exits 130."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hot.cli.gbops
from hot.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--dataset", "mnist-5k", "--train-size", 64, "--test-size", 32, "--batch-size", 32,
        "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu", "--no-plot"]
SMALL = ["--vit-dim", 32, "--vit-depth", 1, "--device", "cpu"]

# (arguments, the option the message must name, the value it must quote)
PARSE_ERRORS = [
    (["train", "--epochs", 0], "--epochs", "0"),
    (["train", "--epochs", -1], "--epochs", "-1"),
    (["train", "--max-steps", -1], "--max-steps", "-1"),
    (["train", "--max-steps", 0], "--max-steps", "0"),
    (["train", "--batch-size", 0], "--batch-size", "0"),
    (["train", "--batch-size", -3], "--batch-size", "-3"),
    (["train", "--train-size", 0], "--train-size", "0"),
    (["train", "--lr", "nan"], "--lr", "nan"),
    (["train", "--lr", -1], "--lr", "-1"),
    (["train", "--weight-decay", -0.1], "--weight-decay", "-0.1"),
    (["train", "--lqs-ratio", 0], "--lqs-ratio", "0"),
    (["train", "--hq-bits", 5], "--hq-bits", "5"),
    (["train", "--exact-steps", -1], "--exact-steps", "-1"),
    (["train", "--lora-r", -4], "--lora-r", "-4"),
    (["train", "--epochs", "two"], "--epochs", "two"),
    (["demo", "--batch-size", 0], "--batch-size", "0"),
    (["demo", "--epochs", 0], "--epochs", "0"),
    (["demo", "--methods", "fp32,nope"], "--methods", "nope"),
    (["memory", "--batch", 0], "--batch", "0"),
    (["memory", "--methods", "fp32,nope"], "--methods", "nope"),
    (["memory", "--input-shape", "3,32"], "--input-shape", "3,32"),
    (["inspect", "--batch", 0], "--batch", "0"),
    (["inspect", "--seq-len", 0], "--seq-len", "0"),
    (["gbops", "--batch", 0], "--batch", "0"),
    (["gbops", "--rank", -8], "--rank", "-8"),
    (["gbops", "--rank", 3], "--rank", "3"),
    (["gbops", "--classes", 0], "--classes", "0"),
    (["gbops", "--top", -1], "--top", "-1"),
]


def options_of(command: str) -> set:
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return {o for a in sub._actions for o in a.option_strings}


def check_one_line(rc, err, command, *needles, given=()):
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert line.startswith(f"hot {command}: error: "), line
    for n in needles:
        assert n in line, (n, line)
    # Every option the message names exists on this subcommand (no advice to use a flag that
    # another subcommand has), unless it quotes what the user typed.
    for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line):
        assert flag in options_of(command) or flag in given, (flag, line)
    return line


@pytest.mark.parametrize("args,flag,value", PARSE_ERRORS, ids=lambda v: str(v))
def test_bad_numbers_are_rejected_at_parse_time(run_text, run_cli, tmp_path, args, flag, value):
    cmd = args[0]
    out = ["--out", tmp_path / "out"] if cmd in ("train", "demo", "memory") else []
    rc, stdout, err = run_text(*args, *out)
    check_one_line(rc, err, cmd, f"argument {flag}: ", value, "give ")
    assert stdout == ""
    assert not (tmp_path / "out").exists()  # rejected before anything was written
    rc, d = run_cli(*args, *out)
    assert rc == 2 and d["exit_status"] == 2 and d["command"] == f"hot {cmd}"
    assert flag in d["error"]


RUN_ERRORS = [
    (["inspect", "tiny-vit", "--dataset", "mnist-5k", "--input-shape", "3,32,32", "--batch", 2,
      *SMALL], "--input-shape 3,32,32"),
    (["inspect", "tiny-vit", "--dataset", "rotten-tomatoes", *SMALL], "--dataset rotten-tomatoes"),
    (["memory", "tiny-vit", "--vit-dim", 30, "--device", "cpu", "--no-plot"], "--vit-dim 30"),
    (["memory", "tiny-vit", "--input-shape", "1,30,30", "--device", "cpu", "--no-plot"],
     "--input-shape 1,30,30"),
    (["gbops", "tiny-vit", "--input-shape", "1,28,32"], "--input-shape 1,28,32"),
    (["train", *TINY, "--image-size", 30], "--image-size 30"),
    (["train", *TINY, "--model", "minilm", "--dataset", "mnist-5k"], "--model minilm"),
    (["train", *TINY, "--device", "nonsense"], "--device nonsense"),
    (["demo", "--smoke", "--dataset", "mnist-5k", "--device", "cpu", "--patch", 5], "--patch 5"),
    (["memory", "tiny-vit", "--backend", "fast", "--device", "cpu"], "--backend fast"),
    (["inspect", "llama-tiny", "--dataset", "mnist-5k", *SMALL], "--dataset mnist-5k"),
    (["memory", "llama-tiny", "--input-shape", "1,28,28", "--device", "cpu", "--no-plot"],
     "--input-shape"),
    (["train", *TINY, "--model", "llama-tiny"], "--model llama-tiny"),
]


@pytest.mark.parametrize("args,needle", RUN_ERRORS, ids=lambda v: str(v))
def test_inputs_that_do_not_fit_are_one_line_errors(run_text, tmp_path, args, needle):
    out = ["--out", tmp_path / "out"] if args[0] in ("train", "demo", "memory") else []
    rc, stdout, err = run_text(*args, *out)
    check_one_line(rc, err, args[0], needle)
    assert not (tmp_path / "out").exists()


def test_unknown_option_points_to_help(run_text):
    rc, _, err = run_text("train", "--no-such-option")
    line = check_one_line(rc, err, "train", "--no-such-option", given=["--no-such-option"])
    assert "hot train --help" in line


def test_unexpected_exception_is_one_line_with_a_debug_hint(run_text, run_cli, monkeypatch):
    def boom(args):
        raise RuntimeError("internal\nstate broken")

    monkeypatch.setattr(hot.cli.gbops, "run", boom)
    rc, _, err = run_text("gbops")
    line = check_one_line(rc, err, "gbops", "unexpected RuntimeError: internal state broken",
                          "--debug", "HOT_DEBUG=1")
    rc, d = run_cli("gbops")
    assert rc == 2 and d["type"] == "RuntimeError" and d["error"] == line.split("error: ", 1)[1]
    rc, _, err = run_text("gbops", "--debug")
    assert rc == 2 and "Traceback" in err and "in boom" in err
    assert err.strip().splitlines()[-1] == line
    from hot.common.options import from_env, override

    assert from_env({"HOT_DEBUG": "1"}).debug is True
    with override(debug=True):
        rc, _, err = run_text("gbops")
    assert rc == 2 and "Traceback" in err


def test_ctrl_c_exits_130(run_text, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(hot.cli.gbops, "run", interrupted)
    rc, _, err = run_text("gbops")
    assert rc == 130 and err.strip() == "hot gbops: error: interrupted."


def test_console_process_prints_no_traceback(tmp_path):
    """The real process (not main() in-process): status 2, one stderr line, nothing on stdout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOT_NO_PROGRESS="1")
    r = subprocess.run([sys.executable, "-m", "hot.cli.main", "train", "--epochs", "0", "--out",
                        str(tmp_path / "run"), "--json"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert json.loads(r.stdout)["error"].startswith("argument --epochs: 0")
