"""How to compile csrc/ into ``hot.fast._C``: one place for setup.py and the JIT loader.

Standard library only (importable before torch) and loaded by file path, so it works from
setup.py at build time as well as from hot/fast/_ext.py at run time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from typing import Iterator, Optional

CSRC = os.path.dirname(os.path.abspath(__file__))
EXT_NAME = "hot.fast._C"

# binding.cpp is the only file with torch headers; each .cu is its own job so ninja can
# compile them in parallel.
SOURCES = ["binding.cpp", "gemm_sm90_s8.cu", "gemm_sm90_s8_bias.cu", "gemm_sm80_s8.cu", "gemm_sm80_s4.cu", "pack_int4.cu"]
HEADERS = ["hot_kernels.h", "launch_util.h", "gemm_sm80.cuh", "gemm_sm90_s8.cuh"]

# sm_80 (A100) and sm_86 (RTX 30xx; sm_89 runs its SASS) for the mma.sync kernels; sm_90a for
# wgmma (the plain sm_90 target cannot issue wgmma).
DEFAULT_ARCHS = "8.0;8.6;9.0a"

# -DNDEBUG: device asserts split the wgmma pipeline (ptxas warning C7510, kernel_tech.md 1.2).
# No -std flag: torch adds the standard it requires (c++20 in torch 2.14; an explicit c++17
# conflicts with it).
NVCC_FLAGS = ["-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-lineinfo"]
CXX_FLAGS = ["-O2"]


def sources() -> list[str]:
    return [os.path.join(CSRC, s) for s in SOURCES]


def cutlass_include_dirs() -> list[str]:
    """The CUTLASS/CuTe headers of the nvidia-cutlass wheel (a header-only build dependency)."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the CUTLASS headers are missing: pip install --no-deps nvidia-cutlass==4.2.0.0"
        )
    root = os.path.join(list(spec.submodule_search_locations)[0], "source")
    dirs = [os.path.join(root, "include"), os.path.join(root, "tools", "util", "include")]
    for d in dirs:
        if not os.path.isdir(d):
            raise RuntimeError(f"the nvidia-cutlass wheel has no {d}; reinstall nvidia-cutlass==4.2.0.0")
    return dirs


def include_dirs() -> list[str]:
    return [CSRC] + cutlass_include_dirs()


def requested_archs() -> str:
    """$TORCH_CUDA_ARCH_LIST as set (empty when unset)."""
    return os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()


@contextlib.contextmanager
def arch_list_set(archs: str) -> Iterator[None]:
    """TORCH_CUDA_ARCH_LIST = archs inside the block: torch.utils.cpp_extension reads its
    -gencode flags from there."""
    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def arch_list(env: Optional[str] = None) -> str:
    """The TORCH_CUDA_ARCH_LIST to build for: the given value, else $TORCH_CUDA_ARCH_LIST, else
    DEFAULT_ARCHS."""
    value = env if env is not None else os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    return value.strip() or DEFAULT_ARCHS


def arch_tag(archs: str) -> str:
    """'8.0;8.6;9.0a' -> 'sm80_sm86_sm90a' (a macro-safe name; the binding reports it)."""
    tags = []
    for item in re.split(r"[;\s,]+", archs.strip()):
        item = item.replace("+PTX", "")
        m = re.fullmatch(r"(\d+)\.(\d+)([a-z]?)", item)
        if m:
            tags.append(f"sm{m.group(1)}{m.group(2)}{m.group(3)}")
    return "_".join(tags) or "none"


def compile_args(archs: str) -> dict[str, list[str]]:
    """Compiler flags; HOT_PTXAS_VERBOSE=1 adds ptxas's register and spill report."""
    nvcc = list(NVCC_FLAGS)
    if os.environ.get("HOT_PTXAS_VERBOSE") == "1":
        nvcc.append("-Xptxas=-v")
    return {"cxx": CXX_FLAGS + [f"-DHOT_CUDA_ARCHS={arch_tag(archs)}"], "nvcc": nvcc}


def nvcc_path(cuda_home: Optional[str]) -> Optional[str]:
    if not cuda_home:
        return None
    p = os.path.join(cuda_home, "bin", "nvcc")
    return p if os.path.isfile(p) else None


def _is_toolkit(root: Optional[str]) -> bool:
    return bool(root) and nvcc_path(root) is not None and os.path.isfile(
        os.path.join(root, "include", "cuda_runtime.h"))


def find_cuda_home(torch_guess: Optional[str]) -> Optional[str]:
    """The CUDA toolkit root: $CUDA_HOME, $CUDA_PATH, torch's guess, /usr/local/cuda, then
    /usr/local/cuda-*; the first that holds bin/nvcc and include/cuda_runtime.h.

    torch guesses the root as the parent of the folder of the first nvcc on PATH, which is
    wrong when that nvcc is a wrapper script (e.g. /usr/local/bin/nvcc -> CUDA_HOME=/usr/local,
    kernel_tech.md section 5), hence the checks.
    """
    import glob

    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), torch_guess, "/usr/local/cuda"]
    candidates += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for c in candidates:
        if _is_toolkit(c):
            return os.path.realpath(c)
    return None


def use_cuda_home(cpp_extension) -> Optional[str]:
    """Points torch.utils.cpp_extension (and child processes) at find_cuda_home(); returns it."""
    home = find_cuda_home(cpp_extension.CUDA_HOME)
    if home is not None and home != cpp_extension.CUDA_HOME:
        cpp_extension.CUDA_HOME = home  # read as a module global by every cpp_extension helper
        os.environ["CUDA_HOME"] = home
    return home
