"""Without a GPU the fast kernels run in the Triton interpreter on CPU tensors.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when hot.fast.kernels.* is first
imported; hot.fast imports those lazily (at the first launch), so setting it here, before any
test of this folder runs, is early enough (tests/conftest.py sets it first anyway).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def ext():
    """hot.fast._ext with its module loaded (HOT_JIT_BUILD=1: JIT-built for the visible GPU when
    not prebuilt), so a missing build fails loudly instead of skipping; the fast backend's
    caches of what the extension offers are cleared so its GEMMs see it (GPU tests only)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from hot.common.options import override
    from hot.fast import _ext, gemm

    with override(jit_build=True), pytest.MonkeyPatch.context() as mp:
        mp.setattr(_ext, "_STATE", {})  # an earlier load() may have cached None without JIT
        if _ext.load() is None:
            pytest.fail(f"hot.fast._C did not load: {_ext.why_unavailable()}")
        gemm.ext_caps.cache_clear()
        yield _ext
