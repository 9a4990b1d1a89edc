"""hot.bench.distributed on CPU (gloo, 1 and 2 processes on 127.0.0.1, the reference backend, tiny
models): its correctness checks pass, a phase that outruns its limit is ended and reported while
the run goes on, and bad options are refused with one line."""

import json

import pytest
import torch.distributed as dist

from hot.bench.distributed import cli, options, report

pytestmark = pytest.mark.skipif(not dist.is_available(),
                                reason="torch.distributed is not available in this build")


def _opts(tmp_path, *flags):
    return options.from_args(["--device", "cpu", "--json", str(tmp_path / "out.json"),
                              "--threads", "1", *flags])


def _after_title(out: str) -> list:
    """The printed lines from the Markdown title on; the title is printed exactly once."""
    lines = out.splitlines()
    return lines[lines.index("## HOT under DDP / FSDP2"):]


@pytest.mark.timeout(240)
def test_checks_pass_on_two_gloo_ranks(tmp_path, capsys):
    # Both workloads, both wrappers: exact 2-rank curves equal the 1-process curve, LQS decides
    # alike on both ranks, a checkpoint restores decisions and step counters on both ranks.
    opts = _opts(tmp_path, "--checks", "exact,lqs,checkpoint", "--exact-steps", "3",
                 "--steps", "2", "--vit-depth", "1", "--llama-layers", "1")
    res = cli.run(opts)
    names = {f"{c} {wl} {w}" for c in ("exact", "lqs", "checkpoint") for wl in ("vit", "llama")
             for w in ("ddp", "fsdp2")}
    got = {c["check"]: c for c in res["checks"]}
    assert set(got) == names
    failed = {k: c["detail"] for k, c in got.items() if c["verdict"] != "PASS"}
    assert not failed, failed
    # The exact check compared something: nonzero, finite losses of the right length.
    exact = got["exact llama fsdp2"]
    assert len(exact["losses_2"]) == 3 and all(0 < v < 20 for v in exact["losses_2"])
    with open(opts.json) as f:
        assert [c["verdict"] for c in json.load(f)["checks"]] == ["PASS"] * len(names)
    md = _after_title(capsys.readouterr().out)
    assert not [line for line in md if line.startswith("[")]  # no progress line after the table
    assert sum(line.startswith("| exact ") for line in md) == 4


@pytest.mark.timeout(120)
def test_a_phase_over_its_limit_is_ended_and_the_run_goes_on(tmp_path, capsys):
    # A limit no phase can meet: the watchdog ends each rank inside the first phase, the launcher
    # reports the timeout, starts the block again at the next phase (which times out alike), and
    # still writes the results and prints the table.
    opts = _opts(tmp_path, "--checks", "checkpoint", "--workloads", "vit",
                 "--phase-timeout", "0.001")
    res = cli.run(opts)
    assert [(p["phase"], p["status"]) for p in res["phases"]] == [
        ("checkpoint vit hot/paper ddp", "timeout"), ("checkpoint vit hot/paper fsdp2", "timeout")]
    for c in res["checks"]:
        assert c["verdict"] == "FAIL" and "not finished after 0.001 s" in c["detail"], c
    with open(opts.json) as f:
        assert [p["status"] for p in json.load(f)["phases"]] == ["timeout", "timeout"]
    md = _after_title(capsys.readouterr().out)
    assert not [line for line in md if line.startswith("[")]  # the table is printed last
    assert [line.split(" | ")[:2] for line in md if line.startswith("| checkpoint")] == [
        ["| checkpoint vit ddp", "FAIL"], ["| checkpoint vit fsdp2", "FAIL"]]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_zero_or_nan_gy_on_one_rank_neither_hangs_nor_splits_lqs(tmp_path):
    # LQS's all-reduce must be reached by every rank, also by one whose g_y says nothing.
    opts = _opts(tmp_path, "--checks", "zero_gy,nan_gy", "--workloads", "vit",
                 "--hang-timeout", "20")
    res = cli.run(opts)
    assert {c["check"]: c["verdict"] for c in res["checks"]} == {
        "zero_gy vit ddp": "PASS", "nan_gy vit ddp": "PASS"}, res["checks"]


@pytest.mark.parametrize("flags, needle", [
    (["--workloads", "vit,resnet"], "--workloads='vit,resnet': resnet is not one of"),
    (["--worlds", "1,4"], "--worlds='1,4': 4 is not one of 1, 2"),
    (["--steps", "0"], "--steps=0 must be > 0"),
    (["--vit-heads", "3"], "heads must divide dim"),
    (["--json", "/nonexistent-folder/x.json"], "cannot write into /nonexistent-folder"),
])
def test_bad_options_exit_2_with_one_line(flags, needle, tmp_path, capsys):
    # A --json among the flags overrides the first one (argparse keeps the last).
    assert cli.main(["--device", "cpu", "--json", str(tmp_path / "x.json"), *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_existing_results_are_never_overwritten(tmp_path, capsys):
    p = tmp_path / "old.json"
    p.write_text("{}")
    assert cli.main(["--device", "cpu", "--json", str(p)]) == 2
    assert "never overwritten" in capsys.readouterr().err and p.read_text() == "{}"


def _outcomes(final_1: list, final_2: float, seeds=(0, 1, 2)) -> dict:
    """Finished curve phases: 1-rank paper curves per seed and one 2-rank DDP curve."""
    from hot.bench.distributed.launch import Outcome
    from hot.bench.distributed.phases import Phase

    out = {}
    for s, v in zip(seeds, final_1):
        ph = Phase("curve", "vit", "none", "hot", "paper", s)
        out[(1, ph)] = Outcome("world 1", 1, ph, "done", {"losses": [2.3, v]})
    ph = Phase("curve", "vit", "ddp", "hot", "paper", seeds[0])
    out[(2, ph)] = Outcome("world 2", 2, ph, "done", {"losses": [2.3, final_2]})
    return out


def test_paper_check_is_a_99_percent_t_prediction_interval():
    # 1-rank losses 1.0, 1.1, 1.2: mean 1.1, sd 0.1, bound t(0.995, 2) * 0.1 * sqrt(4/3).
    bound = 9.925 * 0.1 * (4 / 3) ** 0.5
    ok = report.paper_check(_outcomes([1.0, 1.1, 1.2], 1.1 + 0.99 * bound), "vit", "ddp",
                            (0, 1, 2))
    assert ok["verdict"] == "PASS" and ok["bound"] == pytest.approx(bound)
    bad = report.paper_check(_outcomes([1.0, 1.1, 1.2], 1.1 - 1.01 * bound), "vit", "ddp",
                             (0, 1, 2))
    assert bad["verdict"] == "FAIL"
    one = report.paper_check(_outcomes([1.0], 1.0, seeds=(0,)), "vit", "ddp", (0,))
    assert one["verdict"] == "n/a" and "--seeds" in one["detail"]
    nan = report.paper_check(_outcomes([1.0, 1.1, 1.2], float("nan")), "vit", "ddp", (0, 1, 2))
    assert nan["verdict"] == "FAIL" and "not finite" in nan["detail"]


def test_link_from_nvidia_smi_topology():
    text = ("\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
            "GPU0\t X \tNV18\tSYS\t0-31\t0\t\tN/A\n"
            "GPU1\tNV18\t X \tSYS\t0-31\t0\t\tN/A\n"
            "NIC0\tSYS\tSYS\t X \n\nLegend:\n\n  X    = Self\n")
    assert report.link_of(text) == "NV18"
    assert report.link_of("\tGPU0\tCPU Affinity\nGPU0\t X \t0-31\n") is None  # one GPU
