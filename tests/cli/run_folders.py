"""What the run-folder tests share (tests/cli/test_outputs.py, test_fingerprint.py): the tiny
training task and a folder snapshot; the finished run itself is conftest's ``finished``."""

TINY = ["--dataset", "mnist-5k", "--train-size", 128, "--test-size", 64, "--batch-size", 64,
        "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu", "--no-plot"]


def snapshot(folder):
    """{name: (bytes, mtime_ns)} of every file in ``folder``."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}
