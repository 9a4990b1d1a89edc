"""hot compare: methods x seeds as hot train runs, a table with gaps paired by seed, resumable."""

import json

TASK = ["--", "--dataset", "mnist-5k", "--train-size", 256, "--test-size", 128,
        "--vit-dim", 32, "--vit-depth", 1, "--epochs", 1]


def test_compare_table_resume_and_errors(run_text, tmp_path):
    out = tmp_path / "cmp"
    args = ["compare", "--methods", "fp32,int4", "--seeds", "0,1", "--out", out, *TASK]
    rc, text, _ = run_text(*args)
    assert rc == 0 and "failed" not in text
    rows = {row["method"]: row for row in json.loads((out / "compare.json").read_text())}
    assert set(rows) == {"fp32", "int4"}
    acc = {(m, s): 100 * json.loads((out / "compare" / name / f"seed{s}" / "metrics.json")
                                    .read_text())["test_acc"]
           for m, name in (("fp32", "fp32"), ("int4", "int4")) for s in (0, 1)}
    gaps = [acc["int4", s] - acc["fp32", s] for s in (0, 1)]
    assert abs(rows["int4"]["gap"] - sum(gaps) / 2) < 1e-9
    assert json.loads((out / "compare.json").read_text())[1]["method"] == "int4"
    assert "| int4 |" in (out / "compare.md").read_text()
    runs = {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")}
    rc, text, _ = run_text(*args)  # all finished: nothing reruns
    assert rc == 0 and "0 to run" in text and {p: p.stat().st_mtime_ns for p in out.rglob("metrics.json")} == runs

    for bad, word in ((["--methods", "fp32,nope"], "nope"), (["--seeds", "0,0"], "--seeds")):
        rc, _, err = run_text("compare", *bad, "--out", tmp_path / "x", *TASK)
        assert rc == 2 and word in err and err.count("\n") == 1
    rc, _, err = run_text("compare", "--out", tmp_path / "x", *TASK, "--method", "hot")
    assert rc == 2 and "--method" in err
    assert not (tmp_path / "x").exists()
