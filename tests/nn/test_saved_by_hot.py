"""What a HOT layer keeps beyond its ABC codes: not an autocast copy of an input that its codes
undercut; and SavedTensorMeter's listing of what is kept."""

from __future__ import annotations

import copy

import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config
import torch.nn as nn

import hot
from hot.analysis.saved import CompiledSavedCapture, SavedTensorMeter
from hot_testing import hot_copy

BF16 = torch.bfloat16


def test_auto_compiled_keeps_the_codes_of_an_input_copy_they_undercut():
    """A patch embedding under autocast with the partitioner free to recompute: x is the layer's
    own bf16 copy of an image that needs no gradient; its codes are 1/4 of it."""
    torch.manual_seed(0)
    base = nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), nn.Flatten(2))
    x = torch.randn(2, 3, 16, 16)
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False,
                                          ban_recompute_materialized_backward=False):
        torch._dynamo.reset()
        m = hot_copy(base, hot.HOTConfig(seed=1))
        f = torch.compile(m, backend="inductor", fullgraph=True)
        with SavedTensorMeter(m) as meter, torch.autocast("cpu", dtype=BF16):
            y = f(x)
        y.float().sum().backward()
    # rows: 2 images x 16 patches = 32 -> 16 kept of 48 columns, int8, and 48 float32 scales
    assert meter.total == 16 * 48 + 48 * 4


def test_listing_names_what_is_kept_eagerly_and_compiled():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    m = hot_copy(base, hot.HOTConfig(seed=1).replace(hla={"abc": "save"}))
    x = torch.randn(32, 8)
    with SavedTensorMeter(m, track_modules=True) as meter:
        y = m(x)
    meter.label(y)
    rows = meter.listing()
    assert rows[("1", "GeluBackward0.self", "float32")][:2] == [32 * 16 * 4, 1]
    assert rows[("0", "LinearFnBackward[0]", "int8")][:2] == [8 * 16, 1]
    assert sum(r[0] for r in rows.values()) == meter.total
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        f = torch.compile(copy.deepcopy(m), backend="inductor")
        with CompiledSavedCapture() as cap, SavedTensorMeter(f) as meter:
            y = f(x)
        meter.label(y, cap)
    rows = meter.listing()
    assert ("2", "linear_fwd[1]", "int8") in rows
    assert sum(r[0] for r in rows.values()) == meter.total
    assert all(by != "?" and "CompiledFunction" not in by for _, by, _ in rows)


def _compiled_saved(abc: str):
    """Bytes by dtype that a compiled step of Linear -> LayerNorm -> HOT Linear keeps, default
    partitioner settings."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 16))
    hot.convert(m, hot.HOTConfig(seed=1).replace(hla={"abc": abc}), convert_head=True,
                filter=lambda fqn, _: fqn == "2", backend="reference")
    x = torch.randn(64, 8)
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        torch._dynamo.reset()
        f = torch.compile(m, backend="inductor", fullgraph=True)
        with SavedTensorMeter(m) as meter:
            y = f(x)
        y.sum().backward()
    return meter.by_dtype()


def test_compiled_recompute_keeps_nothing_of_its_own_under_default_settings():
    """HLAConfig(abc="recompute") under torch.compile with the default partitioner: the HOT
    layer's backward reads x through an elementwise copy, so the partitioner rebuilds x from what
    LayerNorm keeps (its input and statistics) instead of keeping x: less than the codes
    abc="save" keeps, and no int8 at all. Keeping x itself (64 x 32 float32, 8 KiB) would be
    more than the codes (1 KiB and 128 B of scales)."""
    save, rc = _compiled_saved("save"), _compiled_saved("recompute")
    assert save.get("int8", 0) == 32 * (64 // 16 * 8)
    assert "int8" not in rc
    assert sum(rc.values()) < sum(save.values())
