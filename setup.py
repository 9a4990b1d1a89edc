"""Builds the optional CUDA extension hot.fast._C; all package metadata lives in pyproject.toml.

The extension is built when HOT_BUILD_EXT is not "0", torch (a CUDA build) is importable at
build time, nvcc is found under CUDA_HOME and the nvidia-cutlass headers are installed. Otherwise
this is a pure-Python install and hot.fast._ext.why_unavailable() says why. Build isolation hides
torch, so build with:

    pip install --no-build-isolation -e .            # TORCH_CUDA_ARCH_LIST default "8.0;8.6;9.0a"

HOT_BUILD_EXT=1 turns a missing prerequisite into an error instead of a pure-Python install.
"""

import importlib.util
import os
import sys

from setuptools import setup

_HERE = os.path.dirname(os.path.abspath(__file__))


def _build_config():
    spec = importlib.util.spec_from_file_location("hot_build_config", os.path.join(_HERE, "csrc", "build_config.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _extension():
    """(ext_modules, cmdclass), or a reason string when the extension cannot be built here."""
    if os.environ.get("HOT_BUILD_EXT", "") == "0":
        return "HOT_BUILD_EXT=0"
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as e:
        return f"torch is not importable at build time ({e}); use pip install --no-build-isolation"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    cfg = _build_config()
    if cfg.use_cuda_home(cpp_extension) is None:
        return f"nvcc not found at build time (CUDA_HOME={cpp_extension.CUDA_HOME!r}); set CUDA_HOME to the toolkit root"
    try:
        include_dirs = cfg.include_dirs()
    except RuntimeError as e:
        return str(e)
    archs = cfg.arch_list()
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs  # read by CUDAExtension for the -gencode flags
    ext = cpp_extension.CUDAExtension(
        cfg.EXT_NAME,
        [os.path.relpath(s, _HERE) for s in cfg.sources()],
        include_dirs=include_dirs,
        extra_compile_args=cfg.compile_args(archs),
        depends=[os.path.join("csrc", h) for h in cfg.HEADERS],
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension}


result = _extension()
if isinstance(result, str):
    if os.environ.get("HOT_BUILD_EXT", "") == "1":
        sys.exit(f"hot: HOT_BUILD_EXT=1 but the CUDA extension cannot be built: {result}")
    print(f"hot: installing without the CUDA extension: {result}", file=sys.stderr)
    setup()
else:
    setup(ext_modules=result[0], cmdclass=result[1])
