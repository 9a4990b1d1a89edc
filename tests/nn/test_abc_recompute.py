"""HLAConfig(abc="recompute"): a linear layer keeps x and forms the ABC codes in backward with the
seed its forward drew, so its gradients equal abc="save"'s bit for bit, eagerly and compiled;
under torch.compile with ban_recompute_materialized_backward off, the compiler rebuilds x from
what other ops keep, and the HOT layers keep nothing of their own.

A different seed or a plan mismatch would change stochastic-rounding codes, i.e. g_W by about a
quantization step: far from the bit-for-bit equality asserted here."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._functorch.config
import torch._inductor.config
import torch.nn as nn

import hot
from hot.models.vit import TinyViT
from hot_testing import saved_by_forward

SAVE = hot.HOTConfig(seed=5)
RECOMPUTE = SAVE.replace(hla={"abc": "recompute"})


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _block():
    """LayerNorm -> Linear -> GELU -> Linear: every HOT input is rebuilt cheaply from what
    LayerNorm (its input and statistics) and GELU (its input) keep anyway."""
    torch.manual_seed(0)
    return nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))


def _grads(model, fwd, n=3, torch_seed=None):
    """Parameter gradients of n steps (no optimizer: the same weights each step)."""
    if torch_seed is not None:
        torch.manual_seed(torch_seed)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randn(4, 8, 32, generator=g)
        model.zero_grad(set_to_none=True)
        fwd(x).square().mean().backward()
        out.append({k: p.grad.clone() for k, p in model.named_parameters()})
    return out


def _assert_equal(a, b):
    for step, (ga, gb) in enumerate(zip(a, b)):
        for k in ga:
            assert torch.equal(ga[k], gb[k]), (
                f"step {step}: {k} differs by {(ga[k] - gb[k]).abs().max()}")


@pytest.mark.parametrize("seed", [5, None])
def test_recompute_gives_the_saved_codes_eagerly_and_compiled(seed):
    # seed=None: the ABC seed comes from torch's generator in forward, in both modes.
    save, rec = SAVE.replace(seed=seed), RECOMPUTE.replace(seed=seed)
    base = _block()
    ref = _grads(m := hot.convert(copy.deepcopy(base), save, backend="reference"), m, torch_seed=3)
    eager = _grads(m := hot.convert(copy.deepcopy(base), rec, backend="reference"), m, torch_seed=3)
    m = hot.convert(copy.deepcopy(base), rec, backend="reference")
    comp = _grads(m, torch.compile(m, backend="aot_eager", fullgraph=True), torch_seed=3)
    _assert_equal(ref, eager)
    _assert_equal(ref, comp)
    assert [int(x.hot_step) for _, x in hot.hot_layers(m)] == [3, 3]


def test_eager_recompute_keeps_x_not_codes():
    m = hot.convert(nn.Sequential(nn.Linear(32, 16)), RECOMPUTE, backend="reference")
    x = torch.randn(64, 32, requires_grad=True)
    _, others, _ = saved_by_forward(m, x)
    assert [t.dtype for t in others] == [torch.float32]
    assert others[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_exact_phase_and_conv_are_unchanged():
    """While exact, x is kept and gradients are exact in both modes; HOTConv2d saves its codes
    whatever abc says (the option is documented for linear layers)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 16, 4))
    x = torch.randn(2, 3, 4, 4)
    a = hot.convert(copy.deepcopy(net), SAVE.replace(exact_steps=1), backend="reference")
    b = hot.convert(copy.deepcopy(net), RECOMPUTE.replace(exact_steps=1), backend="reference")
    _, saved_conv, _ = saved_by_forward(nn.Sequential(b[0]), x)
    assert torch.float32 in {t.dtype for t in saved_conv}  # exact: the patches
    for _ in range(2):  # step 0 exact, step 1 HOT
        ga, gb = [], []
        for model, out in ((a, ga), (b, gb)):
            model.zero_grad(set_to_none=True)
            model(x).square().sum().backward()
            out.extend(p.grad.clone() for p in model.parameters())
        assert all(torch.equal(p, q) for p, q in zip(ga, gb))
    _, saved_conv, _ = saved_by_forward(nn.Sequential(b[0]), x)
    assert torch.int8 in {t.dtype for t in saved_conv}


def _saved(fwd, x):
    """(bytes, dtypes) of what autograd keeps during fwd(x) (each storage once, parameters
    included: this model's parameters are tiny next to the activations at these sizes)."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), t.dtype)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fwd(x).square().mean().backward()
    return sum(v[0] for v in seen.values()), {v[1] for v in seen.values()}


def test_inductor_rebuilds_x_and_keeps_no_codes():
    """With the partitioner allowed to recompute what backward materializes, the compiled
    recompute graph keeps no int8 at all and less than the compiled save graph, and gives its
    gradients bit for bit (the rebuilt LayerNorm and GELU outputs are the same pointwise
    functions of the same saved tensors, so the codes are the same)."""
    base = _block()
    x = torch.randn(8, 64, 32)
    saved, grads = {}, {}
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False,
                                          ban_recompute_materialized_backward=False):
        for name, cfg in (("save", SAVE), ("recompute", RECOMPUTE)):
            torch._dynamo.reset()
            m = hot.convert(copy.deepcopy(base), cfg, backend="reference")
            f = torch.compile(m, backend="inductor", fullgraph=True)
            saved[name] = _saved(f, x)
            grads[name] = _grads(m, f, n=2)
    (b_save, d_save), (b_rec, d_rec) = saved["save"], saved["recompute"]
    assert torch.int8 in d_save and torch.int8 not in d_rec
    # save keeps the two int8 copies (32 and 64 features, rank 8 of 16 rows of 512: 256 rows)
    # and nothing of x; recompute keeps neither: at least the codes' bytes less.
    assert b_rec <= b_save - 256 * (32 + 64)
    _assert_equal(grads["save"], grads["recompute"])


def test_tiny_vit_trains_alike_with_recompute_compiled():
    """Attention, CLS slicing and sequence blocking between the layers."""
    cfg = RECOMPUTE.replace(hla={"blocking": "sequence"})
    torch.manual_seed(0)
    base = TinyViT(image_size=8, channels=1, classes=4, patch=4, dim=32, depth=1, heads=2, mlp=32)
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(3, 1, 8, 8, generator=g) for _ in range(2)]
    res = []
    for c, compiled in ((cfg.replace(hla={"abc": "save"}), False), (cfg, True)):
        m = hot.convert(copy.deepcopy(base), c, backend="reference")
        f = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
        r = []
        for x in xs:
            m.zero_grad(set_to_none=True)
            f(x).square().sum().backward()
            r.append({k: p.grad.clone() for k, p in m.named_parameters()})
        res.append(r)
    _assert_equal(*res)


def test_config_rejects_unknown_abc_mode():
    with pytest.raises(hot.HOTConfigError, match="HLAConfig.abc"):
        hot.HLAConfig(abc="drop")
