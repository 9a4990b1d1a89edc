import contextlib
import io
import json

import pytest

from hot.cli.main import main



@pytest.fixture(autouse=True)
def _no_progress():
    """No progress bars in the CLI tests (HOT_NO_PROGRESS=1 through the options)."""
    from hot.common.options import override

    with override(progress=False):
        yield


@pytest.fixture
def run_cli():
    """Run `hot ARGS --json` in-process; returns (exit status, parsed JSON from stdout)."""

    def run(*args):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main([*map(str, args), "--json"])
        text = out.getvalue()
        return rc, json.loads(text)

    return run


@pytest.fixture
def run_text():
    """Run `hot ARGS` in-process; returns (exit status, stdout, stderr) as text."""

    def run(*args):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([*map(str, args)])
        return rc, out.getvalue(), err.getvalue()

    return run


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-epoch fp32 run with per-epoch checkpoints (trained once for the module)."""
    from run_folders import TINY

    d = tmp_path_factory.mktemp("finished") / "run"
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["train", *map(str, TINY), "--method", "fp32", "--epochs", "2",
                   "--keep-checkpoints", "--out", str(d)])
    assert rc == 0
    return d
