"""hot.nn.backward.patches against F.unfold: the same rows and columns, bit for bit.

HOTConv2d's ABC copy quantizes the patches row by row (blocks of 16 rows, per-column scales), so
a different order would change the saved codes; only values copied, so equality must be exact.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hot.nn.backward import patches

# (C, H, W, kernel, stride, padding, dilation): ViT's non-overlapping patches, ResNet-style
# strided and padded kernels, non-square everything, a crop (H not a multiple of the stride),
# and dilation 2 (the F.unfold path).
GEOMS = [(3, 32, 32, (16, 16), (16, 16), (0, 0), (1, 1)),
         (4, 9, 11, (3, 3), (1, 1), (1, 1), (1, 1)),
         (2, 13, 10, (3, 2), (2, 3), (1, 0), (1, 1)),
         (3, 17, 15, (4, 4), (4, 4), (0, 0), (1, 1)),
         (1, 7, 8, (1, 1), (2, 2), (0, 0), (1, 1)),
         (2, 12, 12, (3, 3), (1, 2), (2, 1), (2, 2))]


@pytest.mark.parametrize("c,h,w,k,s,p,d", GEOMS)
def test_patches_equal_unfold(c, h, w, k, s, p, d):
    x = torch.randn(3, c, h, w, generator=torch.Generator().manual_seed(h * w + c))
    want = F.unfold(x, k, d, p, s)
    want = want.transpose(1, 2).reshape(-1, want.shape[1])
    got = patches(x, k, s, p, d)
    assert got.shape == want.shape
    assert torch.equal(got, want)
