"""Without a GPU the fast kernels run in the Triton interpreter on CPU tensors.

TRITON_INTERPRET is read when a kernel is decorated, i.e. when hot.fast.*_kernels is first
imported; hot.fast imports those lazily (at the first launch), so setting it here, before any
test of this folder runs, is early enough.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

