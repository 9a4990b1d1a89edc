import os
import subprocess
import sys
from pathlib import Path

import pytest

from hot.cli.main import build_parser

COMMANDS = ("demo", "train", "memory", "gbops", "inspect", "bench")


ROOT = Path(__file__).resolve().parents[2]


def test_console_script_help():
    exe = Path(sys.executable).with_name("hot")
    if not exe.exists():
        pytest.skip("the hot console script is not installed in this environment")
    # The installed entry point, importing this checkout's hot (an editable install of another
    # checkout would otherwise be tested).
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0, r.stderr
    for c in COMMANDS:
        assert c in r.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_every_subcommand_has_help_and_json(cmd):
    p = build_parser()
    sub = p._subparsers._group_actions[0].choices[cmd]
    text = sub.format_help()
    assert "--json" in text
    assert len(sub.description or "") > 40  # a real description, not just the name
