"""hot.bench.e2e on the decoders, at a CPU size: modes, records, errors as data, --find-batch,
one process per mode."""

import json
import math
import sys

import pytest
import torch.nn as nn

pytest.importorskip("transformers")

from hot.bench import e2e

TINY = dict(model="llama-tiny", device="cpu", batch=2, seq=32, warmup=1, steps=1)


def test_mode_names_parse_into_method_and_compilation():
    assert e2e.parse_mode("hot") == e2e.Mode("hot", "hot", None, False)
    assert e2e.parse_mode("hot_compile_cg").compile == "reduce-overhead"
    assert e2e.parse_mode("bf16_compile_ro").compile == "reduce-overhead"
    m = e2e.parse_mode("hot_exact_compile_rc")
    assert (m.method, m.compile, m.recompute) == ("hot_exact", "default", True)
    assert e2e.parse_mode("float8_rw_compile").method == "float8_rw"
    for bad in ("hot_compile_xx", "fp8", "compile", "hot_"):
        with pytest.raises(e2e.ModeError, match=bad):
            e2e.parse_mode(bad)


def test_bf16_hot_and_hot_exact_steps_share_the_forward():
    rs = {m: e2e.run_mode(m, **TINY) for m in ("bf16", "hot", "hot_exact")}
    for m, r in rs.items():
        assert "error" not in r, r.get("trace")
        assert len(r["losses"]) == 2 and all(math.isfinite(v) for v in r["losses"])
        assert r["step_ms"] > 0 and r["tokens_per_s"] > 0 and r["seq"] == 32
        # every timed step, in run order; step_ms and min_ms are their median and minimum
        t = r["step_times_ms"]
        assert len(t) == len(r["losses"]) - TINY["warmup"] and min(t) == round(r["min_ms"], 3)
        assert sorted(t)[len(t) // 2] == round(r["step_ms"], 3)
    # Same seed, same batch, same weights before the first update: HOT changes only backward.
    assert rs["bf16"]["losses"][0] == rs["hot"]["losses"][0] == rs["hot_exact"]["losses"][0]
    layers = 7 * 4 + 1  # llama-tiny: 4 blocks of 7 Linears, and lm_head
    assert rs["hot"]["hot_layers"] == layers and rs["hot"]["hot_backend"] == "reference"
    r = e2e.run_mode("hot", exclude_head=True, **TINY)
    assert r["hot_layers"] == layers - 1
    assert rs["hot"]["min_in_features"] == 0


def test_quantized_forward_mode_and_memory_record():
    """hot-q: the forward quantized (its first loss differs from bf16's, finite); --memory
    counts the saved tensors: the ABC codes (int8) in eager mode, the parameters exactly."""
    rb = e2e.run_mode("bf16", **TINY)
    r = e2e.run_mode("hot-q", memory=True, abc="save", **TINY)
    assert "error" not in r, r.get("trace")
    assert r["forward"] == "int8" and r["recipe"] == "hot-q" and r["abc"] == "save"
    assert r["losses"][0] != rb["losses"][0] and all(math.isfinite(v) for v in r["losses"])
    mem = r["memory"]
    assert mem["saved_by_dtype_bytes"]["int8"] > 0
    assert mem["params_GiB"] == round(r["params"] * 4 / 2**30, 3)
    assert mem["optimizer_state_GiB"] > 2 * mem["params_GiB"] * 0.99  # AdamW's two moments


def test_min_in_features_reaches_the_hot_layers(monkeypatch):
    seen = []
    real = e2e._prepare

    def spy(m, *a, **kw):
        out = real(m, *a, **kw)
        import hot
        seen.extend(l.hot_config.min_in_features for _, l in hot.hot_layers(m))
        return out

    monkeypatch.setattr(e2e, "_prepare", spy)
    r = e2e.run_mode("hot", min_in_features=4096, **TINY)
    assert "error" not in r, r.get("trace")
    assert r["min_in_features"] == 4096 and seen and set(seen) == {4096}


def test_float8_modes_convert_all_but_the_output_layer():
    pytest.importorskip("torchao")
    for m in ("float8_tw", "float8_rw"):
        r = e2e.run_mode(m, **TINY)
        assert "error" not in r, r.get("trace")
        assert r["float8_layers"] == 7 * 4 and r["float8_emulated"] is True
        assert all(math.isfinite(v) for v in r["losses"])


def test_failing_modes_are_recorded_and_the_run_goes_on(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = e2e.main(["--model", "llama-tiny", "--device", "cpu", "--in-process", "--batch", "1",
                   "--seq", "16", "--steps", "1", "--warmup", "0",
                   "--modes", "nope,hot_compile_cg,bf16", "--json", str(out)])
    assert rc == 0
    rs = json.loads(out.read_text())
    assert [r["mode"] for r in rs] == ["nope", "hot_compile_cg", "bf16"]
    assert "ModeError" in rs[0]["error"] and "needs --device cuda" in rs[1]["error"]
    assert not rs[0]["oom"] and "error" not in rs[2] and rs[2]["step_ms"] > 0
    with pytest.raises(SystemExit) as e:  # never overwrites earlier results
        e2e.main(["--model", "llama-tiny", "--json", str(out)])
    assert e.value.code == 2 and "exists" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        e2e.main(["--model", "vit-b", "--seq", "16"])
    assert e.value.code == 2 and "--seq 16" in capsys.readouterr().err


def test_find_batch_halves_until_a_batch_fits():
    seen = []

    def run(b):
        seen.append(b)
        return {"batch": b, "oom": b > 5}

    r = e2e.find_batch(run, 24)
    assert seen == [24, 12, 6, 3] and r["batch"] == 3 and r["oom_batches"] == [24, 12, 6]
    seen.clear()
    r = e2e.find_batch(lambda b: seen.append(b) or {"batch": b, "oom": True}, 4)
    assert seen == [4, 2, 1] and r["oom"] and r["oom_batches"] == [4, 2, 1]
    r = e2e.find_batch(lambda b: {"batch": b, "error": "ValueError: x", "oom": False}, 8)
    assert r["batch"] == 8 and r["oom_batches"] == []  # other errors are not retried


def test_each_mode_runs_in_its_own_process(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    args = ["--model", "llama-tiny", "--device", "cpu", "--batch", "1", "--seq", "16",
            "--steps", "1", "--warmup", "0", "--modes", "bf16", "--json", str(out)]
    assert e2e.main(args) == 0
    (r,) = json.loads(out.read_text())
    assert r["mode"] == "bf16" and "error" not in r, r.get("trace")
    assert r["batch"] == 1 and math.isfinite(r["loss"])
    # A process that dies is recorded with its exit status.
    monkeypatch.setattr(sys, "executable", "false")
    assert e2e.main([*args[:-1], str(tmp_path / "s.json")]) == 0
    (r,) = json.loads((tmp_path / "s.json").read_text())
    assert r["mode"] == "bf16" and "exited with status 1" in r["error"]


def test_profile_categories_separate_hot_kernels_from_the_rest():
    from hot.bench.e2e import kernel_category

    assert kernel_category("quantize_kernel") == "hot_pass"
    assert kernel_category("stats_kernel") == "hot_pass"
    assert kernel_category("onepass_kernel") == "hot_pass"
    assert kernel_category("fixup_kernel") == "hot_pass"
    assert kernel_category("int8_gemm_nt_kernel") == "int8_gemm"
    assert kernel_category("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<"
                           "cute::tuple<int, int, int>, signed char, signed char>>") == "int8_gemm"
    # bf16 GEMMs (cuBLAS), inductor's fused kernels and attention are what HOT leaves alone
    for name in ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NTT", "triton_poi_fused_add_mul_0",
                 "void cutlass::device_kernel<flash::FlashAttnFwdSm90<cutlass::bfloat16_t>>"):
        assert kernel_category(name) == "other"


def test_profile_recognizes_mangled_cutlass_int8_gemms():
    # The start of a kernel name of csrc/gemm_sm90_s8.cu as the profiler reports it (mangled;
    # neither torch's demangler nor c++filt demangles the whole name), cut where it names the
    # int8 GMMA atom, and an Ampere one by CUTLASS 2's saturating integer operator.
    from hot.bench.e2e import kernel_category

    sm90 = ("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute5tupleIJiiiiEEENS1_"
            "10collective13CollectiveMmaINS1_34MainloopSm90TmaGmmaWarpSpecializedILi4ENS5_IJNS4_"
            "1CILi2EEENSA_ILi1EEESC_EEENS1_35KernelTmaWarpSpecializedCooperativeEEENS5_IJNSA_ILi"
            "128EEENSA_ILi256EEESG_EEEaNS5_IJlSC_lEEEaSJ_NS4_8TiledMMAINS4_8MMA_AtomIJNS4_4SM90"
            "4GMMA27MMA_64x256x32_S32S8S8_SS_TNEEEE")
    sm80 = "_ZN7cutlass7Kernel2INS_4gemm6kernel22GemmINS_4arch21OpMultiplyAddSaturateEEEEEvv"
    assert kernel_category(sm90) == "int8_gemm"
    assert kernel_category(sm80) == "int8_gemm"
    # a bf16 CUTLASS GEMM (mangled) is not HOT's
    assert kernel_category("_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalI"
                           "MMA_64x256x16_F32BF16BF16_SS_TNEEvv") == "other"


def test_shared_codes_mode_keeps_one_copy_per_input():
    """--hla-share siblings on the Llama decoder (transformers' LlamaForCausalLM): q/k/v and
    gate/up read one input each, so eagerly the step keeps 4 sets of ABC codes per block (q/k/v,
    o, gate/up, down) instead of 7, and the lm_head's."""
    r0 = e2e.run_mode("hot-q", memory=True, abc="save", **TINY)
    r = e2e.run_mode("hot-q", memory=True, abc="save", hla_share="siblings", **TINY)
    assert "error" not in r, r.get("trace")
    assert r["hla_share"] == "siblings" and r0["hla_share"] == "none"
    assert all(math.isfinite(v) for v in r["losses"])
    assert r["losses"][0] == r0["losses"][0]  # the forward's values do not depend on the seeds
    int8 = lambda rec: rec["memory"]["saved_by_dtype_bytes"]["int8"]  # noqa: E731
    # The int8 codes of an input are proportional to its width (rank-8 rows of the same tokens).
    # llama-tiny (hidden 128, FFN 512, 4 blocks, lm_head): each layer's own copy is
    # 4 (3*128 + 128 + 2*128 + 512) + 128 = 5248 widths; one per input 4 (128 + 128 + 128 +
    # 512) + 128 = 3712.
    assert int8(r) * 5248 == int8(r0) * 3712, (int8(r), int8(r0))


def test_shared_codes_are_formed_once_per_input_under_compile():
    """torch.compile (inductor, CPU) on transformers' Llama with --hla-share siblings: the forward
    graph forms x's codes once per input: 4 hot::x_codes per block (q/k/v, o, gate/up, down)
    and the lm_head's, 17 for llama-tiny's 29 HOT layers."""
    import torch._inductor.config as ic

    from hot.nn import autograd as ag

    counts = []
    with ic.patch(post_grad_custom_post_pass=lambda g: counts.append(
            sum(1 for n in g.nodes if n.target is ag.x_codes))):
        r = e2e.run_mode("hot-q_compile", hla_share="siblings", **TINY)
    assert "error" not in r, r.get("trace")
    assert r["hot_layers"] == 29 and counts[0] == 4 * 4 + 1, counts


def test_kernel_log_lists_gpu_kernels_in_start_order_and_never_overwrites(tmp_path):
    """kernel_rows, write_kernel_rows: the profile's GPU events sorted by start (the profiler's list is not), CPU
    events left out, one tab-separated line each; an existing file is an error, not replaced."""
    from types import SimpleNamespace

    import torch

    from hot.bench.e2e import kernel_rows, write_kernel_rows

    gpu, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(start, us, name, dev=gpu):
        return SimpleNamespace(time_range=SimpleNamespace(start=start), device_time=us,
                               name=name, device_type=dev)

    evs = [ev(30.0, 2.5, "quantize_kernel"), ev(5.0, 1.0, "aten::mm", cpu),
           ev(10.0, 4.25, "stats_kernel"), ev(1.0, 0.5, "Memset (Device)")]
    path = tmp_path / "k.tsv"
    assert write_kernel_rows(kernel_rows(evs), str(path)) == 3
    assert path.read_text().splitlines() == [
        "1.000\t0.500\tMemset (Device)", "10.000\t4.250\tstats_kernel",
        "30.000\t2.500\tquantize_kernel"]
    with pytest.raises(FileExistsError):
        write_kernel_rows(kernel_rows(evs), str(path))
    assert len(path.read_text().splitlines()) == 3


def test_kernels_flag_needs_profile_and_a_new_directory(tmp_path, capsys):
    from hot.bench import e2e

    for argv, said in ((["--kernels", str(tmp_path)], "add --profile"),
                       (["--profile", "--kernels", str(tmp_path / "none")], "not a directory")):
        with pytest.raises(SystemExit) as ex:
            e2e.main(["--device", "cpu", "--model", "llama-tiny", "--modes", "bf16", *argv])
        assert ex.value.code == 2 and said in capsys.readouterr().err
    (tmp_path / "bf16.tsv").write_text("kept\n")
    with pytest.raises(SystemExit) as ex:
        e2e.main(["--device", "cpu", "--model", "llama-tiny", "--modes", "bf16", "--profile",
                  "--kernels", str(tmp_path)])
    assert ex.value.code == 2 and "exists" in capsys.readouterr().err
    assert (tmp_path / "bf16.tsv").read_text() == "kept\n"


def test_kernel_log_is_written_only_by_the_attempt_that_ran_to_its_end(tmp_path, monkeypatch):
    """With --find-batch, an attempt that runs out of memory after its profile (in the --memory
    steps) leaves no kernel log, so the retry at half the batch writes it; a mode that never
    completes writes none."""
    import torch

    from hot.bench import e2e

    rows = [(1.0, 0.5, "stats_kernel"), (2.0, 0.25, "quantize_kernel")]

    def fake(md, w, warmup, steps, profile, tw, memory, keep):
        assert keep  # the rows are asked for; the file is step_time's to write
        if w.batch > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (after the profile)")
        return {"mode": md.name, "batch": w.batch}, rows

    monkeypatch.setattr(e2e, "_step_time", fake)
    path = tmp_path / "bf16.tsv"
    run = lambda b: e2e.run_mode("bf16", batch=b, model="llama-tiny", device="cpu",  # noqa: E731
                                 profile=True, kernels=str(path))
    r = e2e.find_batch(run, 8)
    assert "error" not in r and r["batch"] == 2 and r["oom_batches"] == [8, 4]
    assert path.read_text().splitlines() == ["1.000\t0.500\tstats_kernel",
                                             "2.000\t0.250\tquantize_kernel"]
    never = tmp_path / "never.tsv"
    r = e2e.find_batch(lambda b: e2e.run_mode("bf16", batch=b + 8, model="llama-tiny",
                                              device="cpu", profile=True, kernels=str(never)), 2)
    assert r["oom"] and not never.exists()
