"""hot.bench.study: cells run as `hot train` processes, a finished cell is not rerun, and the table's
paired gaps and HLA shares follow from the cells' metrics."""

import json
import math

import pytest

from hot.bench import study


def _metric(root, task, setting, seed):
    return json.loads((root / task / setting / f"seed{seed}" / "metrics.json").read_text())


def test_hla_kept():
    s = study.SETTINGS
    assert study.hla_kept(s["paper"], 100, 0) == 1.0
    assert study.hla_kept(s["rank16"], 100, 0) == 0.0
    assert study.hla_kept(s["rank4"], 100, 0) == 1.5
    assert study.hla_kept(s["warmup1"], 100, 25) == 0.75
    assert study.hla_kept(s["fp32"], 100, 0) is None
    # per-layer ranks: the run's own share (hot train's hla_rank_share), times its HOT steps
    assert s["hla_mlp"].per_layer and not s["paper"].per_layer
    assert study.hla_kept(s["hla_mlp"], 100, 0, 0.5) == 0.5
    assert study.hla_kept(s["hla_mlp_warmup1"], 100, 20, 0.5) == 0.4


def test_data_root_reaches_the_tasks_that_read_it(tmp_path):
    cmd = {t: study.Cell(study.TASKS[t], study.SETTINGS["paper"], 0, tmp_path, 1)
           .command("cpu", "/data") for t in ("tinyvit-fmnist", "lm", "minilm-rt")}
    assert "--data-root" in cmd["tinyvit-fmnist"] and "--data-root" in cmd["lm"]
    assert "--data-root" not in cmd["minilm-rt"]  # the Rotten Tomatoes wheel


def test_schedules_reach_hot_train(tmp_path):
    task = study.TASKS["tinyvit-fmnist"]
    cmd = study.Cell(task, study.SETTINGS["warmup1_cooldown1"], 0, tmp_path, 5).command("cpu",
                                                                                      None)
    assert cmd[cmd.index("--exact-steps") + 1] == "469"
    assert cmd[cmd.index("--exact-from") + 1] == str(4 * 469)
    assert study.hla_kept(study.SETTINGS["warmup1_cooldown1"], 5 * 469, 2 * 469) == 0.6


def test_run_resume_and_table(tmp_path, capsys):
    argv = ["run", "--out", str(tmp_path), "--tasks", "smoke", "--settings", "fp32,rank4",
            "--seeds", "0,1", "--workers", "2", "--device", "cpu", "--epochs", "2"]
    assert study.main(argv) == 0
    done = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("metrics.json")}
    assert len(done) == 4
    capsys.readouterr()
    assert study.main(argv) == 0  # everything finished: nothing reruns
    assert "0 to run" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("metrics.json")} == done

    rows = {r["setting"]: r for r in json.loads((tmp_path / "study.json").read_text())}
    accs = {k: [100 * _metric(tmp_path, "smoke", k, s)["test_acc"] for s in (0, 1)]
            for k in ("fp32", "rank4")}
    d = [a - b for a, b in zip(accs["rank4"], accs["fp32"])]
    assert rows["rank4"]["gap"] == pytest.approx(sum(d) / 2)
    assert rows["rank4"]["gap_se"] == pytest.approx(abs(d[0] - d[1]) / 2, abs=1e-9)
    assert rows["rank4"]["hla_kept"] == 1.5 and rows["fp32"]["hla_kept"] is None
    assert "gap" not in rows["fp32"]
    assert _metric(tmp_path, "smoke", "rank4", 0)["hot_config"]["hla"]["rank"] == 4
    assert not math.isnan(rows["fp32"]["sd"])
    assert (tmp_path / "study.md").read_text().count("| smoke |") == 2


def test_bad_arguments(tmp_path, capsys):
    assert study.main(["run", "--out", str(tmp_path), "--settings", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert study.main(["run", "--out", str(tmp_path), "--seeds", "0,0"]) == 2
    assert study.main(["run", "--out", str(tmp_path), "--tasks", "minilm-rt-lora",
                       "--settings", "warmup1"]) == 2
    assert not any(tmp_path.iterdir())


def test_merge_pairs_rows_of_several_runs_with_fp32_by_seed(tmp_path, capsys):
    def row(setting, values, **kw):
        return {"task": "tinyvit-fmnist", "setting": setting, "about": "", "metric": "test_acc",
                "seeds": [0, 1, 2], "values": values, "mean": sum(values) / 3, "sd": 0.0,
                "hla_kept": kw.get("kept"), "ms_per_step": None, "peak_MiB": None}
    a = [row("fp32", [88.0, 87.0, 86.0]), row("paper", [80.0, 80.0, 80.0], kept=1.0)]
    b = [row("paper", [87.0, 86.0, 86.0], kept=1.0), row("hla_mlp", [87.5, 86.0, 85.0], kept=0.5)]
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    rows = {r["setting"]: r for r in study.pair(a + b)}
    # b's paper row replaces a's; gaps paired by seed: (-1, -1, 0) and (-0.5, -1, -1)
    assert rows["paper"]["gap"] == pytest.approx(-2 / 3)
    assert rows["paper"]["gap_se"] == pytest.approx(math.sqrt(1 / 3) / math.sqrt(3))
    assert rows["hla_mlp"]["gap"] == pytest.approx(-2.5 / 3)
    assert "gap" not in rows["fp32"]
    png = tmp_path / "p.png"
    pytest.importorskip("matplotlib")
    assert study.main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                       "--png", str(png), "--md", str(tmp_path / "t.md")]) == 0
    assert png.stat().st_size > 1000 and "hla_mlp" in (tmp_path / "t.md").read_text()


def test_recommended_setting_warms_up_for_40_percent_of_the_run(tmp_path):
    def exact(task, epochs):
        cmd = study.Cell(study.TASKS[task], study.SETTINGS["recommended"], 0, tmp_path,
                         epochs).command("cpu", None)
        return int(cmd[cmd.index("--exact-steps") + 1])
    assert exact("tinyvit-fmnist", 5) == 938  # 0.4 * 5 * 469: the warmup2 setting's steps
    assert exact("lm", 2) == 64 and exact("minilm-rt", 2) == 64
    assert study.hla_kept(study.SETTINGS["recommended"], 160, 64) == pytest.approx(0.6)


def test_table_values_follow_the_seeds_order_past_seed_9(tmp_path):
    """Folders sort as text (seed10 before seed2); each row's values must stand in the order
    of its seeds, which merge pairs by."""
    acc = {("fp32", 2): 0.80, ("fp32", 10): 0.90, ("paper", 2): 0.70, ("paper", 10): 0.85}
    for (setting, seed), a in acc.items():
        d = tmp_path / "smoke" / setting / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"test_acc": a, "steps": 2}))
    rows = {r["setting"]: r for r in study.collect(tmp_path, [study.TASKS["smoke"]])}
    assert rows["fp32"]["seeds"] == [2, 10]
    assert rows["fp32"]["values"] == pytest.approx([80.0, 90.0])
    assert rows["paper"]["values"] == pytest.approx([70.0, 85.0])
    assert rows["paper"]["gap"] == pytest.approx(-7.5)  # (-10 - 5) / 2
    # merge pairs a row without a gap (another run's) by the same seeds
    bare = {k: v for k, v in rows["paper"].items() if k not in ("gap", "gap_se", "paired_seeds")}
    merged = {r["setting"]: r for r in study.pair([rows["fp32"], bare])}
    assert merged["paper"]["gap"] == pytest.approx(-7.5)


def test_a_setting_is_also_paired_with_the_one_it_changes(tmp_path):
    """hot-q (the quantized forward) is compared with hot (the same backward) seed by seed:
    perplexity as a relative change in %, on the seeds both have."""
    ppl = {("hot", 0): 100.0, ("hot", 1): 200.0, ("hot-q", 0): 101.0, ("hot-q", 1): 204.0,
           ("hot-q", 2): 50.0}
    for (setting, seed), v in ppl.items():
        d = tmp_path / "lm" / setting / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"val_ppl": v, "steps": 2}))
    rows = {r["setting"]: r for r in study.collect(tmp_path, [study.TASKS["lm"]])}
    q = rows["hot-q"]
    assert (q["pair"], q["pair_paired_seeds"]) == ("hot", 2)
    assert q["pair_gap"] == pytest.approx(1.5) and q["pair_gap_se"] == pytest.approx(0.5)
    assert "pair_gap" not in rows["hot"]
    assert "hot-q against hot (paired by seed, 2 seeds): +1.50 % ± 0.50" in study.markdown(
        list(rows.values()))
