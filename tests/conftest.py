import os

import pytest
import torch
from hypothesis import settings

from hot.common.walsh import hadamard16

# Every test starts from the same RNG state; hypothesis runs are derandomized so CI is repeatable.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

# A custom operator whose outputs alias its inputs or each other is an error under torch.compile
# wherever CI is set (torch._functorch.config) and a warning elsewhere; tests treat it as the
# error it is everywhere, so a local run fails where CI would.
import torch._functorch.config as _aot_config  # noqa: E402

if hasattr(_aot_config, "error_on_custom_op_aliasing"):  # torch releases that have the check
    _aot_config.error_on_custom_op_aliasing = True

# Without a GPU the fast kernels' tests run in the Triton interpreter, which must be on before
# anything imports triton: test modules of other folders do so at collection, and triton's own
# @jit library functions (tl.cdiv, tl.max) are then compiled-mode objects the interpreter rejects.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _forward_error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The elementwise bound of tests/nn/test_quantized_forward.py for y = x w^T (x: L x I, w: O x I), in float64."""
    i16 = (x.shape[1] + 15) // 16 * 16
    h = torch.block_diag(*[hadamard16()] * (i16 // 16))

    def rows(t):
        t = torch.nn.functional.pad(t.double(), (0, i16 - t.shape[1])) @ h
        return t, t.abs().amax(1, keepdim=True) / 127, t.abs().sum(1, keepdim=True)

    a, sx, la = rows(x)
    c, sw, lc = rows(w)
    slack = 1e-5 * (a.abs() @ c.abs().t())
    return sx / 2 * lc.t() + la * sw.t() / 2 + i16 * sx * sw.t() / 4 + slack


@pytest.fixture
def forward_error_bound():
    """HOTConfig(forward="int8")'s elementwise error bound for y = x w^T (float64, CPU)."""
    return _forward_error_bound
