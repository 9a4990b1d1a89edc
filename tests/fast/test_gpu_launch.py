"""hot.fast.launch.Direct on a GPU: a cached compiled kernel must only be reused for arguments
Triton would have specialized the same way (pointer alignment, ints equal to 1 or divisible by
16, int32 vs int64 range), and must compute what ``kernel[grid]`` computes."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, y_ptr, n, stride, add, B: tl.constexpr, SQUARE: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        m = i < n
        v = tl.load(x_ptr + i.to(tl.int64) * stride, mask=m, other=0.0)
        if SQUARE:
            v = v * v
        tl.store(y_ptr + i, v + add, mask=m)

    return k


def test_direct_equals_triton_launch_across_specializations():
    from hot.fast.launch import Direct, Meta

    k = _kernel()
    d = Direct(k)
    base = torch.randn(5000, device="cuda")
    # (offset into base: 16-byte aligned or not, n: 1 / multiple of 16 / other, stride 1 / 16 / 3,
    # add: 1 / 16 / 7 / beyond int32), each twice so the second call is a cache hit.
    cases = [(0, 1, 1, 1), (1, 160, 16, 16), (4, 161, 3, 7), (3, 33, 1, 1 << 33), (0, 320, 1, 1),
             (1, 1, 16, 7), (0, 161, 3, 16)]
    for off, n, stride, add in cases * 2:
        for square in (False, True):
            x = base[off:]
            y1 = torch.full((n,), float("nan"), device="cuda")
            y2 = torch.full((n,), float("nan"), device="cuda")
            grid = ((n + 63) // 64,)
            k[grid](x, y1, n, stride, add, B=64, SQUARE=square)
            d(grid, (x, y2, n, stride, add), Meta(B=64, SQUARE=square))
            torch.cuda.synchronize()
            assert torch.equal(y1, y2), (off, n, stride, add, square)
    # Every distinct specialization got its own entry; hits reused them.
    assert 4 <= len(d.cache) <= len(cases) * 2
