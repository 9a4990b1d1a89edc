import os

import pytest
import torch
from hypothesis import settings

# Every test starts from the same RNG state; hypothesis runs are derandomized so CI is repeatable.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=25,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

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
