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
from hot_testing import is_abc_seed, saved_by_forward, step_grads

SAVE = hot.HOTConfig(seed=5).replace(hla={"abc": "save"})
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


def _inputs(shape, n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for _ in range(n)]


def _train_grads(base, cfg, compiled: bool, xs):
    """step_grads of a converted copy of ``base`` (eager, or aot_eager-compiled)."""
    m = hot.convert(copy.deepcopy(base), cfg, backend="reference")
    fwd = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
    return step_grads(m, fwd, xs)


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
    xs = _inputs((4, 8, 32), 3)
    res = []
    for cfg in (save, rec):
        torch.manual_seed(3)
        res.append(_train_grads(base, cfg, False, xs))
    torch.manual_seed(3)
    m = hot.convert(copy.deepcopy(base), rec, backend="reference")
    res.append(step_grads(m, torch.compile(m, backend="aot_eager", fullgraph=True), xs))
    _assert_equal(res[0], res[1])
    _assert_equal(res[0], res[2])
    assert [int(x.hot_step) for _, x in hot.hot_layers(m)] == [3, 3]


def test_eager_recompute_keeps_x_not_codes():
    m = hot.convert(nn.Sequential(nn.Linear(32, 16)), RECOMPUTE, backend="reference")
    x = torch.randn(64, 32, requires_grad=True)
    _, others, _ = saved_by_forward(m, x)
    others = [t for t in others if not is_abc_seed(t)]
    assert [t.dtype for t in others] == [torch.float32]
    assert others[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.Flatten(), nn.Linear(32, 4))


@pytest.mark.parametrize("exact_steps", [0, 1])
def test_conv_recompute_gives_the_saved_codes_eagerly_and_compiled(exact_steps):
    """exact_steps=1: step 0 is exact in both modes (x or the patches kept), step 1 HOT."""
    base = _cnn()
    xs = _inputs((2, 3, 4, 4), 2, seed=4)
    res = [_train_grads(base, cfg.replace(exact_steps=exact_steps), compiled, xs)
           for cfg, compiled in ((SAVE, False), (RECOMPUTE, False), (RECOMPUTE, True))]
    _assert_equal(res[0], res[1])
    _assert_equal(res[0], res[2])


def test_conv_recompute_keeps_x_where_the_codes_would_be_larger():
    """A 3x3 stride-1 conv's patches have 9 C columns per position, so its rank-8 codes take
    4.5 bytes per element of x: more than x itself in fp32 (4) or bf16 (2)."""
    conv = nn.Conv2d(8, 16, 3, padding=1)
    x = torch.randn(2, 8, 16, 16)
    _, kept_save, _ = saved_by_forward(hot.convert(nn.Sequential(copy.deepcopy(conv)), SAVE,
                                                   backend="reference"), x)
    _, kept_rec, _ = saved_by_forward(hot.convert(nn.Sequential(copy.deepcopy(conv)), RECOMPUTE,
                                                  backend="reference"), x)
    kept_rec = [t for t in kept_rec if not is_abc_seed(t)]
    assert [t.untyped_storage().data_ptr() for t in kept_rec] == [x.untyped_storage().data_ptr()]
    codes = [t for t in kept_save if t.dtype == torch.int8]
    # 2 * 16 * 16 = 512 positions (rows), 8 * 9 = 72 columns, 8 of 16 rows kept
    assert sum(t.numel() for t in codes) == 512 // 2 * 72 == 4.5 * x.numel()


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
            grads[name] = step_grads(m, f, _inputs((4, 8, 32), 2))
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
    xs = _inputs((3, 1, 8, 8), 2, seed=2)
    res = [_train_grads(base, c, compiled, xs)
           for c, compiled in ((cfg.replace(hla={"abc": "save"}), False), (cfg, True))]
    _assert_equal(*res)


def test_config_rejects_unknown_abc_mode():
    with pytest.raises(hot.HOTConfigError, match="HLAConfig.abc"):
        hot.HLAConfig(abc="drop")


AUTO = SAVE.replace(hla={"abc": "auto"})


def test_kept_by_producer_reads_the_node_type():
    from hot.nn.backward import kept_by_producer

    x = torch.randn(2, 4, 8, 16, requires_grad=True)
    assert not kept_by_producer(x)  # a leaf
    assert kept_by_producer(torch.relu(x * 2))  # ReLU keeps its result
    assert kept_by_producer((x * 2).relu_())
    assert not kept_by_producer(torch.nn.functional.gelu(x))  # GELU keeps its input, not x
    assert not kept_by_producer(torch.relu(x * 2).flatten(1))  # a view: another node
    o = torch.nn.functional.scaled_dot_product_attention(x, x, x)
    assert kept_by_producer(o)  # attention keeps its output (for its own backward)
    with torch.no_grad():
        assert not kept_by_producer(torch.relu(x))


def test_auto_keeps_no_more_than_save_and_gives_its_gradients():
    """A ResNet-like stack: the first conv's input is the image (save: codes), the second conv's
    is ReLU's output (auto: x, which ReLU keeps anyway), the Linear's is a view (save)."""
    base = _cnn()
    x = torch.randn(4, 3, 4, 4)
    kept, grads = {}, {}
    for name, cfg in (("save", SAVE), ("auto", AUTO)):
        m = hot.convert(copy.deepcopy(base), cfg, backend="reference")
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        m.zero_grad(set_to_none=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = m(x)
        y.square().sum().backward()
        kept[name] = sum(seen.values())
        grads[name] = [{k: p.grad.clone() for k, p in m.named_parameters()}]
    _assert_equal(grads["save"], grads["auto"])
    # What auto does not keep: the second conv's codes, 8 of its 16 patch rows (4 images x 2 x 2
    # output positions) by 8 * 9 = 72 columns in int8, and their 72 float32 column scales; it
    # keeps the 8-byte ABC seed instead.
    assert kept["auto"] == kept["save"] - 16 // 2 * 72 - 72 * 4 + 8


def test_auto_under_compile_follows_the_partitioner_flag():
    base = _block()
    x = torch.randn(8, 64, 32)
    for flag, int8_kept in ((True, True), (False, False)):
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False,
                                              ban_recompute_materialized_backward=flag):
            torch._dynamo.reset()
            m = hot.convert(copy.deepcopy(base), AUTO, backend="reference")
            _, dtypes = _saved(torch.compile(m, backend="inductor", fullgraph=True), x)
        assert (torch.int8 in dtypes) == int8_kept


def test_auto_linear_after_relu_keeps_nothing_of_its_own():
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    x = torch.randn(48, 32)
    _, kept_save, _ = saved_by_forward(hot.convert(copy.deepcopy(base), SAVE,
                                                   backend="reference"), x)
    # (a drawn selection also keeps the forward's 8-byte step beside the codes: not counted)
    kept_save = [t for t in kept_save if not is_abc_seed(t)]
    m = hot.convert(copy.deepcopy(base), AUTO, backend="reference")
    y, kept_auto, _ = saved_by_forward(m, x)
    kept_auto = [t for t in kept_auto if not is_abc_seed(t)]
    # save: each layer's codes (int8) and scales; auto: the second layer keeps ReLU's output,
    # which ReLU keeps anyway (one storage), and no codes of its own (only the 8-byte seed).
    ptr = {t.untyped_storage().data_ptr() for t in kept_auto}
    codes = [t for t in kept_auto if t.dtype == torch.int8]
    assert [t.shape for t in codes] == [(32, 24)]  # the first layer's: 48 rows -> 24, 32 features
    assert len(ptr) == len({t.untyped_storage().data_ptr() for t in kept_save}) - 2
