import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """These tests use toy tensors: with 2 OpenMP threads on a loaded 2-core machine every
    parallel elementwise op (floor, round) waits ~8 ms for the second thread (measured: floor of
    3,072 floats 7.8 ms with 2 threads, 0.004 ms with 1)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
