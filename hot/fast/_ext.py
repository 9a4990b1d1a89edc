"""Loader and Python wrappers of the CUDA extension ``hot.fast._C`` (sources in csrc/).

Interface for the fast backend (all tensors on one CUDA device; nothing here runs on CPU):

    load() -> module | None
        The extension: the prebuilt ``hot.fast._C`` (pip install --no-build-isolation -e .), else,
        with options().jit_build (HOT_JIT_BUILD=1), a copy compiled now with
        torch.utils.cpp_extension.load into options().jit_cache (default ~/.cache/hot/jit). None
        when neither works; cached after the first call.
    why_unavailable(kernel=None, device=None) -> str | None
        None when ``kernel`` ('sm90', 'sm80' or None for the module alone) can run on
        ``device``, else a plain reason ("not built: nvcc not found at build time", "built
        without sm_90a", "import failed: ...").
    gemm_s8s8_sm90(a, b, sa, sb, out_dtype=torch.bfloat16, max_k=0, bias=None) -> (M, N)
        int8 wgmma GEMM, compute capability 9.0 only.
    gemm_s8s8_sm80(a, b, sa, sb, out_dtype=torch.bfloat16, max_k=0, bias=None) -> (M, N)
        int8 mma.sync GEMM, compute capability 8.x and 9.0.
    gemm_s4s4_sm80(a_packed, b_packed, sa, sb, out_dtype=torch.bfloat16, max_k=0, bias=None) -> (M, N)
        int4 mma.sync GEMM on pack_int4 output; native on 8.x, emulated (~24x slower) on 9.0.
    pack_int4(codes, check=True) -> packed;  unpack_int4(packed, k) -> codes
    max_k(kind) -> int;  info() -> dict
    result_or_raise(ret) -> result
        For callers of the raw module: its functions return (result, err) (see Errors below).

Errors: no C++ exception leaves the raw module, and its messages are built without iostreams (on
the H200 machine any std::ostringstream in a JIT-built extension, TORCH_CHECK included, crashes
the process; docs/kernels.md). Each of its functions returns (result, err): err is '' on
success, else "<Class>: <message>" with result None. The wrappers here raise it: ValueError for
a bad argument (the message names the function, the argument, its value and the fix),
RuntimeError for a GPU or build that cannot run the kernel or a kernel that failed, and
torch.OutOfMemoryError when an allocation inside the binding failed.

The three GEMMs share one contract, that of hot.common.ops.int_gemm_nt with exact integer sums:
    a: (M, K) codes, b: (N, K) codes, both K-contiguous with 16-byte aligned rows and data
       (int8 tensors; for int4, uint8 tensors of K/2 bytes per row from pack_int4);
    sa: (M, 1) or (1, 1) float32, sb: (N, 1) or (1, 1) float32, bias: None or (N,) float32;
    out[m, n] = cvt((float32(sum_k a[m, k] * b[n, k]) * sa[m]) * sb[n] [+ bias[n]])
    with the sum exact in int32, each float32 operation rounded to nearest in this order (the
    order of the reference backend), cvt = round to nearest into out_dtype (float32, bfloat16
    or float16). gemm_s8s8_sm90 adds the bias in its epilogue; the others (and a chunked K)
    write float32 and the binding adds it before the one rounding into out_dtype. K must be a multiple of 16 (int8) or 32 (int4; pack_int4 pads to it); M and N
    are free (N is padded to 16 internally by copying b, which costs a copy of b).
    K longer than max_k (default and cap: the int32 overflow bound, 130,816 for int8 and
    33,554,176 for int4) is split into chunks; each chunk's float32 result
    (float32(partial) * sa) * sb is summed in chunk order in float32 and then cast to out_dtype,
    so the chunked result can differ from the one-pass result by float32 rounding only.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from types import ModuleType
from typing import Optional

import torch

from ..common.options import options

_LOCK = threading.Lock()
_STATE: dict = {}  # "module": ModuleType | None, "reason": str | None

_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# The class names csrc/binding.cpp puts before ": " in its error strings.
_ERROR_CLASSES = {"ValueError": ValueError, "RuntimeError": RuntimeError,
                  "OutOfMemoryError": torch.OutOfMemoryError}


def _csrc_dir() -> str:
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "csrc")


def _build_config():
    import importlib.util

    path = os.path.join(_csrc_dir(), "build_config.py")
    if not os.path.isfile(path):
        raise RuntimeError(f"the CUDA sources are not shipped with this install (no {path}); "
                           "JIT needs a source checkout")
    spec = importlib.util.spec_from_file_location("hot_build_config", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _jit_arch_list() -> str:
    """TORCH_CUDA_ARCH_LIST (a build variable, read by build_config), else only what the
    visible GPUs need (a JIT build is for this machine): 9.0 -> '9.0a' (wgmma), 8.x -> '8.x'."""
    requested = _build_config().requested_archs()
    if requested:
        return requested
    archs = set()
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        archs.add(f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}")
    return ";".join(sorted(archs)) or _build_config().DEFAULT_ARCHS


def jit_build(archs: Optional[str] = None, build_dir: Optional[str] = None, verbose: bool = False) -> ModuleType:
    """Compiles csrc/ now with torch.utils.cpp_extension.load and returns the module.

    ninja rebuilds only what changed, so a second call with the same sources and flags is quick.
    Raises on any failure (missing nvcc, compiler error).
    """
    from torch.utils import cpp_extension

    cfg = _build_config()
    if cfg.use_cuda_home(cpp_extension) is None:
        raise RuntimeError(f"nvcc not found (CUDA_HOME={cpp_extension.CUDA_HOME!r}); set CUDA_HOME to the toolkit root")
    archs = archs or _jit_arch_list()
    tag = cfg.arch_tag(archs)
    if build_dir is None:
        root = options().jit_cache or os.path.join(os.path.expanduser("~"), ".cache", "hot", "jit")
        pyver = f"py{sys.version_info.major}{sys.version_info.minor}"
        build_dir = os.path.join(root, f"torch{torch.__version__.replace('+', '_')}_{pyver}_{tag}")
    os.makedirs(build_dir, exist_ok=True)
    with cfg.arch_list_set(archs):  # cpp_extension reads the -gencode list from the environment
        flags = cfg.compile_args(archs)
        return cpp_extension.load(
            name="hot_fast_C",
            sources=cfg.sources(),
            extra_include_paths=cfg.include_dirs(),
            extra_cflags=flags["cxx"],
            extra_cuda_cflags=flags["nvcc"],
            build_directory=build_dir,
            verbose=verbose,
        )


def _not_built_reason() -> str:
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return f"not built: torch {torch.__version__} is a CPU-only build"
    try:
        cfg = _build_config()
    except RuntimeError as e:
        return f"not built: {e}"
    if cfg.find_cuda_home(cpp_extension.CUDA_HOME) is None:
        return "not built: nvcc not found at build time (set CUDA_HOME, then pip install --no-build-isolation -e .)"
    return ("not built: run `pip install --no-build-isolation -e .` (or set HOT_JIT_BUILD=1 to compile "
            "on first use)")


def _import_prebuilt() -> ModuleType:
    """hot.fast._C, or the module file named by options().ext_so (HOT_EXT_SO: a JIT build copied
    from another machine; scripts/gpu_run.sh sets it only when built from the same csrc/)."""
    so = options().ext_so
    if not so:
        return importlib.import_module("hot.fast._C")
    spec = importlib.util.spec_from_file_location("hot_fast_C", so)
    if spec is None or spec.loader is None:
        raise ImportError(f"HOT_EXT_SO={so!r} is not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stale_reason(module: ModuleType) -> Optional[str]:
    """Why ``module`` cannot be used with these wrappers, or None. A module built from sources
    older than the (result, err) convention returns bare results, which result_or_raise would
    misread (a 2-row tensor unpacks into two rows): refuse it at load time instead."""
    ret = module.info()
    if not (isinstance(ret, tuple) and len(ret) == 2):
        return (f"stale build: {getattr(module, '__file__', module)} predates the (result, err) error "
                "convention of csrc/binding.cpp; rebuild it (pip install --no-build-isolation -e ., "
                "or delete the JIT cache)")
    return None


def load() -> Optional[ModuleType]:
    """The extension module, or None (then why_unavailable() says why). Cached."""
    with _LOCK:
        if "module" in _STATE:
            return _STATE["module"]
        module, reason = None, None
        try:
            module = _import_prebuilt()
            reason = _stale_reason(module)
            if reason is not None:
                module = None
        except ImportError as e:
            missing = isinstance(e, ModuleNotFoundError) and e.name == "hot.fast._C"
            reason = _not_built_reason() if missing else f"import failed: {e}"
        if module is None and options().jit_build:
            try:
                module = jit_build()
                reason = _stale_reason(module)
                if reason is not None:
                    module = None
            except Exception as e:  # reported through why_unavailable, never silently used
                reason = f"{reason}; JIT build failed: {type(e).__name__}: {e}"
        _STATE["module"], _STATE["reason"] = module, reason
        return module


def why_unavailable(kernel: Optional[str] = None, device: Optional[torch.device] = None) -> Optional[str]:
    """None when ``kernel`` can run on ``device`` (default: the current CUDA device), else why.

    kernel: None (the module only), 'sm90' (gemm_s8s8_sm90) or 'sm80' (gemm_s8s8_sm80,
    gemm_s4s4_sm80).
    """
    mod = load()
    if mod is None:
        return _STATE["reason"]
    if kernel is None:
        return None
    if kernel not in ("sm90", "sm80"):
        raise ValueError(f"kernel must be None, 'sm90' or 'sm80', got {kernel!r}")
    info = result_or_raise(mod.info())
    if kernel == "sm90" and not info["sm90a"]:
        return f"built without sm_90a (archs {info['archs']}); rebuild with TORCH_CUDA_ARCH_LIST containing 9.0a"
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        return f"device {dev} is not a CUDA device"
    major, minor = torch.cuda.get_device_capability(dev)
    if kernel == "sm90" and (major, minor) != (9, 0):
        return f"gemm_s8s8_sm90 needs compute capability 9.0, {dev} has {major}.{minor}"
    if kernel == "sm80":
        if major < 8:
            return f"the sm80 kernels need compute capability >= 8.0, {dev} has {major}.{minor}"
        ok = any(
            int(t[2]) == major and (int(t[3]) == minor if t.endswith("a") else int(t[3]) <= minor)
            for t in info["archs"].split("_") if len(t) >= 4 and t[2:4].isdigit()
        )
        if not ok:
            return f"built for {info['archs']}, which has no code for compute capability {major}.{minor}"
    return None


def _module() -> ModuleType:
    mod = load()
    if mod is None:
        raise RuntimeError(f"hot.fast._C is unavailable: {_STATE['reason']}")
    return mod


def result_or_raise(ret):
    """The result of a raw-module call ``ret = (result, err)``; raises the error ``err`` names
    ("ValueError: msg" -> ValueError(msg), an unknown class -> RuntimeError(err))."""
    if not (isinstance(ret, tuple) and len(ret) == 2):
        raise RuntimeError(f"hot.fast._C returned {type(ret).__name__}, not (result, err): a stale build; rebuild it")
    result, err = ret
    if err:
        cls, sep, msg = err.partition(": ")
        exc = _ERROR_CLASSES.get(cls) if sep else None
        raise exc(msg) if exc is not None else RuntimeError(err)
    if result is None:  # never hand a caller None in place of a tensor
        raise RuntimeError("hot.fast._C returned neither a result nor an error")
    return result


def _dtype_name(out_dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[out_dtype]
    except KeyError:
        raise ValueError(f"out_dtype must be torch.float32, torch.bfloat16 or torch.float16, got {out_dtype}") from None


def gemm_s8s8_sm90(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, max_k: int = 0,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out = cvt((float32(a @ b^T) * sa) * sb^T [+ bias]) on Hopper wgmma (CUTLASS 3.x; the tile
    and schedule by the GEMM's shape, csrc/gemm_sm90_s8.cuh); int8 a (M, K), b (N, K); see the
    module docstring for the exact contract."""
    return result_or_raise(_module().gemm_s8s8_sm90(a, b, sa, sb, _dtype_name(out_dtype), int(max_k), bias))


def gemm_s8s8_sm80(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, max_k: int = 0,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out = cvt((float32(a @ b^T) * sa) * sb^T [+ bias]) on Ampere mma.sync m16n8k32 (CUTLASS
    2.x, 128x256x64 tile); int8 a (M, K), b (N, K); see the module docstring."""
    return result_or_raise(_module().gemm_s8s8_sm80(a, b, sa, sb, _dtype_name(out_dtype), int(max_k), bias))


def gemm_s4s4_sm80(a_packed: torch.Tensor, b_packed: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, max_k: int = 0,
                   bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """out = cvt((float32(a @ b^T) * sa) * sb^T [+ bias]) on Ampere mma.sync m16n8k64 int4
    (CUTLASS 2.x, 128x256x128 tile), where a = unpack(a_packed) (M, K) and b = unpack(b_packed)
    (N, K), K = 2 * a_packed.shape[1] (a multiple of 32: pack_int4 pads with zero codes, which
    add nothing)."""
    return result_or_raise(_module().gemm_s4s4_sm80(a_packed, b_packed, sa, sb, _dtype_name(out_dtype),
                                                    int(max_k), bias))


def pack_int4(codes: torch.Tensor, check: bool = True) -> torch.Tensor:
    """codes (R, K) int8 in [-8, 7] -> packed (R, ceil(K/32)*16) uint8 with
    packed[r, j] = (c[r, 2j] & 0xF) | ((c[r, 2j+1] & 0xF) << 4), c = codes zero-padded to a
    multiple of 32 columns (the cutlass::int4b_t order: low nibble = even element).
    check=True raises ValueError if any code lies outside [-8, 7]: the pack kernel sets a device
    flag, read back with one sync; check=False skips the sync for callers whose codes are in
    range by construction."""
    return result_or_raise(_module().pack_int4(codes, bool(check)))


def unpack_int4(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The inverse of pack_int4: (R, B) uint8 -> (R, k) int8 codes, sign-extended nibbles, k <= 2B."""
    return result_or_raise(_module().unpack_int4(packed, int(k)))


def max_k(kind: str) -> int:
    """The largest K one GEMM call accumulates in int32 without overflow: 'int8' or 'int4'."""
    info = result_or_raise(_module().info())
    return int(info[{"int8": "max_k_int8", "int4": "max_k_int4"}[kind]])


def info() -> dict:
    """Build facts of the loaded module: archs, sm90a, max_k_int8, max_k_int4, cutlass_version."""
    return dict(result_or_raise(_module().info()))
