"""The CUDA extension (csrc/) builds here, on a CPU-only machine, and guards its entry points:
a bad argument comes back from the raw module as an error string, never as a C++ exception
(docs/kernels.md, "The pack_int4 segfault"), and the hot.fast._ext wrappers raise it.

The compile test needs a CUDA build of torch, nvcc (CUDA_HOME), ninja and the nvidia-cutlass
headers, and skips naming whichever is missing. To keep the suite fast it compiles every source
for one target only, sm_90a (the one that exercises every kernel template: the wgmma GEMM and the
two mma.sync GEMMs), into a persistent ninja cache ($HOT_TEST_BUILD_CACHE, default
~/.cache/hot/test_build), so only the first run after a source change pays the compile.
The full three-arch build is measured by hand (docs/build.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import pytest
import torch

from hot.fast import _ext

CI_ARCHS = "9.0a"


def _cfg():
    return _ext._build_config()


def _missing_prerequisite():
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return "torch is a CPU-only build"
    if _cfg().find_cuda_home(cpp_extension.CUDA_HOME) is None:
        return f"no CUDA toolkit (bin/nvcc + include/cuda_runtime.h) found; torch guessed {cpp_extension.CUDA_HOME!r}"
    if importlib.util.find_spec("cutlass_library") is None:
        return "nvidia-cutlass (the CUTLASS headers) is not installed"
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
        return "ninja is not installed"
    return None


@pytest.fixture(scope="module")
def built():
    why = _missing_prerequisite()
    if why:
        pytest.skip(f"cannot compile csrc/ here: {why}")
    root = os.environ.get("HOT_TEST_BUILD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hot", "test_build")
    build_dir = os.path.join(root, f"torch{torch.__version__.replace('+', '_')}_{_cfg().arch_tag(CI_ARCHS)}")
    t0 = time.perf_counter()
    mod = _ext.jit_build(archs=CI_ARCHS, build_dir=build_dir)
    print(f"csrc build/load for {CI_ARCHS}: {time.perf_counter() - t0:.1f} s")
    return mod


def test_arch_tag_parses_torch_arch_lists():
    cfg = _cfg()
    assert cfg.arch_tag("8.0;8.6;9.0a") == "sm80_sm86_sm90a"
    assert cfg.arch_tag("8.0 8.6+PTX") == "sm80_sm86"
    assert cfg.arch_tag("") == "none"
    assert cfg.arch_list("") == cfg.DEFAULT_ARCHS == "8.0;8.6;9.0a"


def test_cuda_home_skips_a_wrapper_folder(tmp_path, monkeypatch):
    # A folder with bin/nvcc but no CUDA headers (an nvcc wrapper script) is not a toolkit.
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    home = _cfg().find_cuda_home(str(tmp_path))
    assert home != str(tmp_path)
    toolkit = tmp_path / "toolkit"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "include").mkdir()
    (toolkit / "bin" / "nvcc").write_text("")
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    monkeypatch.setenv("CUDA_PATH", str(toolkit))
    assert _cfg().find_cuda_home(None) == os.path.realpath(toolkit)


def test_compile_flags_keep_ndebug_and_leave_the_standard_to_torch():
    flags = _cfg().compile_args("8.0;9.0a")
    assert "-DNDEBUG" in flags["nvcc"]  # device asserts serialize wgmma (kernel_tech.md 1.2)
    assert not any(f.startswith("-std") for f in flags["nvcc"] + flags["cxx"])
    assert "-DHOT_CUDA_ARCHS=sm80_sm90a" in flags["cxx"]


def test_kernel_sources_do_not_include_torch():
    # Keeping torch headers out of the .cu files is what keeps the build fast (and free of
    # cuSPARSE headers): only binding.cpp may include them.
    cfg = _cfg()
    for name in cfg.SOURCES + cfg.HEADERS:
        if name == "binding.cpp":
            continue
        text = open(os.path.join(cfg.CSRC, name)).read()
        for banned in ("torch/", "ATen/", "c10/"):
            assert banned not in text, f"{name} includes {banned}"


def test_why_unavailable_names_a_reason_when_absent(monkeypatch):
    monkeypatch.delenv("HOT_JIT_BUILD", raising=False)
    monkeypatch.setattr(_ext, "_STATE", {})

    def no_prebuilt():
        raise ModuleNotFoundError("No module named 'hot.fast._C'", name="hot.fast._C")

    monkeypatch.setattr(_ext, "_import_prebuilt", no_prebuilt)
    assert _ext.load() is None
    why = _ext.why_unavailable()
    assert why is not None and why.startswith("not built")
    with pytest.raises(RuntimeError, match="unavailable: not built"):
        _ext.gemm_s8s8_sm80(torch.zeros(16, 16, dtype=torch.int8), torch.zeros(16, 16, dtype=torch.int8),
                            torch.ones(16, 1), torch.ones(16, 1))


def test_result_or_raise_raises_the_class_the_binding_names():
    # The raw module's (result, err) convention, csrc/binding.cpp: err = "<Class>: <message>".
    t = torch.zeros(2, 3)
    assert _ext.result_or_raise((t, "")) is t
    with pytest.raises(ValueError, match=r"^hot.fast._C.pack_int4: codes must be int8, got Float$"):
        _ext.result_or_raise((None, "ValueError: hot.fast._C.pack_int4: codes must be int8, got Float"))
    with pytest.raises(torch.OutOfMemoryError, match="^hot.fast._C.gemm_s8s8_sm80: CUDA out of memory"):
        _ext.result_or_raise((None, "OutOfMemoryError: hot.fast._C.gemm_s8s8_sm80: CUDA out of memory"))
    with pytest.raises(RuntimeError, match="^hot.fast._C.gemm_s8s8_sm90: needs a Hopper GPU"):
        _ext.result_or_raise((None, "RuntimeError: hot.fast._C.gemm_s8s8_sm90: needs a Hopper GPU"))
    # An error of a class the wrapper does not know is still raised, whole.
    with pytest.raises(RuntimeError, match="^KeyError: x$"):
        _ext.result_or_raise((None, "KeyError: x"))
    with pytest.raises(RuntimeError, match="neither a result nor an error"):
        _ext.result_or_raise((None, ""))
    # A bare tensor (a module built before the convention): a 2-row tensor must not be unpacked
    # into (row 0, row 1).
    with pytest.raises(RuntimeError, match="stale build"):
        _ext.result_or_raise(torch.zeros(2, 5))


def test_load_refuses_a_module_built_before_the_error_convention(monkeypatch):
    class Stale:
        __file__ = "/old/_C.so"

        @staticmethod
        def info():
            return {"archs": "sm90a"}  # the old return: a bare dict, no err

    monkeypatch.delenv("HOT_JIT_BUILD", raising=False)
    monkeypatch.setattr(_ext, "_STATE", {})
    monkeypatch.setattr(_ext, "_import_prebuilt", lambda: Stale)
    assert _ext.load() is None
    assert _ext.why_unavailable().startswith("stale build: /old/_C.so predates the (result, err)")


@pytest.fixture
def wrappers_on(built, monkeypatch):
    """hot.fast._ext with the freshly built module loaded, as load() would have it."""
    monkeypatch.setattr(_ext, "_STATE", {"module": built, "reason": None})
    return _ext


@pytest.mark.slow  # a cold nvcc build of csrc/ takes 2-4 minutes on 2 cores: CI runs it
def test_module_imports_and_reports_its_build(built):
    info, err = built.info()
    assert err == ""
    assert info["archs"] == "sm90a"
    assert info["sm90a"] is True
    # The chunk bounds are the int32 overflow bounds: K * 128^2 and K * 8^2 below 2^31.
    assert info["max_k_int8"] * 128 * 128 < 2**31 <= (info["max_k_int8"] + 256) * 128 * 128
    assert info["max_k_int4"] * 64 < 2**31 <= (info["max_k_int4"] + 256) * 64
    assert info["cutlass_version"].startswith("4.")


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["gemm_s8s8_sm90", "gemm_s8s8_sm80", "gemm_s4s4_sm80"])
def test_gemms_return_errors_instead_of_throwing(built, wrappers_on, fn):
    dt = torch.uint8 if "s4" in fn else torch.int8
    a = torch.zeros(16, 16, dtype=dt)
    b = torch.zeros(8, 16, dtype=dt)
    # The raw module: no exception crosses it, the error comes back as a string.
    out, err = getattr(built, fn)(a, b, torch.ones(16, 1), torch.ones(8, 1), "bfloat16", 0)
    assert out is None
    assert err == (f"ValueError: hot.fast._C.{fn}: a must be a CUDA tensor, got one on cpu; move the operands "
                   "to the GPU or use backend='reference'")
    # The wrapper raises it, naming the function, the argument, its device and the fix.
    with pytest.raises(ValueError, match=rf"^hot.fast._C.{fn}: a must be a CUDA tensor, got one on cpu; move"):
        getattr(wrappers_on, fn)(a, b, torch.ones(16, 1), torch.ones(8, 1), torch.bfloat16)


@pytest.mark.slow
def test_pack_returns_errors_instead_of_throwing(built, wrappers_on):
    codes = torch.zeros(4, 32, dtype=torch.int8)
    assert built.pack_int4(codes, True) == (None, "ValueError: hot.fast._C.pack_int4: codes must be a CUDA tensor, "
                                                  "got one on cpu")
    out, err = built.unpack_int4(torch.zeros(4, 16, dtype=torch.uint8), 32)
    assert out is None and err.startswith("ValueError: hot.fast._C.unpack_int4: packed must be a CUDA tensor")
    with pytest.raises(ValueError, match="^hot.fast._C.pack_int4: codes must be a CUDA tensor, got one on cpu$"):
        wrappers_on.pack_int4(codes)
    with pytest.raises(ValueError, match="^hot.fast._C.unpack_int4: packed must be a CUDA tensor"):
        wrappers_on.unpack_int4(torch.zeros(4, 16, dtype=torch.uint8), 32)
    assert wrappers_on.info()["archs"] == "sm90a" and wrappers_on.max_k("int8") == built.info()[0]["max_k_int8"]
