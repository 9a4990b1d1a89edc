"""HLAConfig(share="siblings") (hot.nn.groups): sibling Linear layers follow their group source's
seeds for x's codes and drawn rows, so layers reading one x form the same codes of it, and
torch.compile forms them once (AOT autograd's common-subexpression elimination merges the
hot::x_codes calls). Unbiasedness: tests/nn/test_unbiased_hla.py."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import hot
from hot.nn import autograd as ag
from hot.nn.groups import abc_source
from hot_testing import step_grads


class Attention(nn.Module):
    """q, k, v read one x; o reads another input of the same width as x."""

    def __init__(self, d=32, h=48):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, h), nn.Linear(d, h), nn.Linear(d, h)
        self.o = nn.Linear(h, d)
        self.p = nn.Linear(d, d)  # same width as q's input, reads another tensor

    def forward(self, x):
        a = torch.tanh(self.q(x)) * self.k(x) + self.v(x)
        return self.p(self.o(a) + 1.0)


def _model(share: str, quantized: bool = False, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    m = nn.Sequential(Attention(), nn.Linear(32, 8))
    cfg = (hot.HOTConfig.quantized() if quantized else hot.HOTConfig()).replace(
        seed=3, hla={"share": share})
    return hot.convert(m, cfg, convert_head=True, backend="reference")


def _saved_codes(m, x):
    """The INT8 tensors the forward keeps for backward, in the order the layers ran."""
    got = []

    def pack(t):
        if t.dtype == torch.int8:
            got.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = m(x)
    return y, got


@pytest.mark.parametrize("quantized", [False, True])
def test_siblings_form_the_same_codes_of_one_input(quantized):
    x = torch.randn(2, 16, 32)
    _, own = _saved_codes(_model("none", quantized), x)
    _, shared = _saved_codes(_model("siblings", quantized), x)
    q, k, v, o, p = shared[:5]
    assert torch.equal(q, k) and torch.equal(q, v)  # one x, the source's seeds
    assert not torch.equal(q, p)  # p follows q's seeds too, but reads another tensor
    assert torch.equal(own[0], q)  # the source's own codes are unchanged
    assert not torch.equal(own[1], own[0])  # with share="none" each layer rounds its own way


def test_eager_forms_them_once_for_the_same_data_only():
    """Eagerly the siblings' calls on one tensor reuse the first call's codes (one storage kept
    for backward); an in-place change of x in between forms them again."""
    att = _model("siblings")[0]
    x = torch.randn(2, 16, 32)
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: t if t.dtype != torch.int8 else got.append(t) or t, lambda t: t):
        got = []
        att.q(x), att.k(x)
        x.add_(0.5)  # same tensor, new values
        att.v(x), att.v(x.clone())
    q, k, v, v2 = got
    assert q.data_ptr() == k.data_ptr()
    assert not torch.equal(v, q) and v.data_ptr() != q.data_ptr()
    assert torch.equal(v2, v) and v2.data_ptr() != v.data_ptr()  # another tensor: a new pass
    # the next step (the source's counter advanced): the same x, new codes (new seeds)
    att.q(x).sum().backward()
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: t if t.dtype != torch.int8 else got.append(t) or t, lambda t: t):
        got = []
        att.k(x)
    assert got[0].data_ptr() != v.data_ptr() and not torch.equal(got[0], v)


@pytest.mark.parametrize("quantized", [False, True])
def test_compile_forms_a_shared_input_codes_once(quantized):
    """Under torch.compile (inductor, on the CPU here) the q, k, v calls of hot::x_codes are one
    node (3 calls where the layers read 3 inputs: x, o's input, p's and the head's are other
    tensors, o's group is its own); outputs and gradients are eager's."""
    import torch._inductor.config as ic

    counts = []
    x = torch.randn(2, 16, 32)
    eager, compiled = _model("siblings", quantized), _model("siblings", quantized)
    torch._dynamo.reset()
    with ic.patch(post_grad_custom_post_pass=lambda g: counts.append(
            sum(1 for n in g.nodes if n.target is ag.x_codes))):
        yc = torch.compile(compiled)(x)
        yc.sum().backward()
    ye = eager(x)
    ye.sum().backward()
    # q/k/v (one x) + o + p + head = 4 distinct (input, source) pairs, from 6 layer calls
    assert counts[0] == 4, counts
    torch.testing.assert_close(yc, ye, rtol=1e-6, atol=1e-6)
    for (name, a), (_, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_groups_are_siblings_of_one_width_and_follow_copies():
    m = _model("siblings")
    att = m[0]
    assert abc_source(att.k) is att.q and abc_source(att.v) is att.q
    assert abc_source(att.p) is att.q  # same parent, same in_features
    assert abc_source(att.o) is att.o and abc_source(m[1]) is m[1]
    c = copy.deepcopy(m)
    assert abc_source(c[0].k) is c[0].q
    # another config on one member: it follows its own seeds again
    att.k.set_hot_config(att.k.hot_config.replace(seed=4))
    assert abc_source(att.k) is att.k
    plain = _model("none")[0]
    assert abc_source(plain.k) is plain.k  # share="none": each layer its own
    hot.unconvert(m)
    assert "_hot_abc_group" not in att.v.__dict__


def test_share_values_are_validated():
    with pytest.raises(hot.HOTConfigError, match="share"):
        hot.HLAConfig(share="all")
    with pytest.raises(hot.HOTConfigError, match="amax='current'"):
        hot.HLAConfig(share="siblings", selection="lowpass", amax="delayed")


# ---------------------------------------------------------------- with HLAConfig(abc="recompute")


@pytest.mark.parametrize("quantized", [False, True])
def test_recompute_gives_the_saved_shared_codes_eagerly_and_compiled(quantized):
    """With recompute the siblings' backward forms x's codes with the source's seeds at the
    forward's step (hot::bwd_codes): the codes abc="save" keeps, so every gradient equals
    save's bit for bit, eagerly and under torch.compile (aot_eager). Another seed or step would
    change the stochastic rounding of the codes, and g_W by about a quantization step."""
    xs = [torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    res = []
    for abc, compiled in (("save", False), ("recompute", False), ("recompute", True)):
        m = _model("siblings", quantized)
        for _, layer in hot.hot_layers(m):
            layer.set_hot_config(layer.hot_config.replace(hla={"abc": abc}))
        torch._dynamo.reset()
        fwd = torch.compile(m, backend="aot_eager", fullgraph=True) if compiled else m
        res.append(step_grads(m, fwd, xs))
    for got in res[1:]:
        for step, (a, b) in enumerate(zip(res[0], got)):
            for k in a:
                assert torch.equal(a[k], b[k]), (step, k, (a[k] - b[k]).abs().max())


def test_recompute_forms_the_shared_codes_once_where_it_keeps_nothing(monkeypatch):
    """With recompute, eagerly v's backward codes of x serve k and q (backward runs head, p, o,
    v, k, q: 4 passes for 6 layers); under torch.compile hot::x_codes is still one node per
    (input, source) and the forward keeps no INT8 codes (each sibling's hot::layer_bwd forms
    them: a shared backward operator would be moved to forward and its codes kept)."""
    import torch._inductor.config as ic

    m = _model("siblings")
    for _, layer in hot.hot_layers(m):
        layer.set_hot_config(layer.hot_config.replace(hla={"abc": "recompute"}))
    calls = []
    real = ag._bwd_codes
    monkeypatch.setattr(ag, "_bwd_codes", lambda *a: calls.append(a[2]) or real(*a))
    m(torch.randn(2, 16, 32)).sum().backward()
    assert len(calls) == 4 and len(set(calls)) == 3, calls  # q's group twice: x, and p's input

    graphs = []
    torch._dynamo.reset()
    with ic.patch(post_grad_custom_post_pass=lambda g: graphs.append(g)):
        torch.compile(m)(torch.randn(2, 16, 32)).sum().backward()
    fwd = graphs[0]
    assert sum(1 for n in fwd.nodes if n.target is ag.x_codes) == 4
    (out,) = [n for n in fwd.nodes if n.op == "output"]
    kept = [a for a in out.args[0] if isinstance(a, torch.fx.Node) and "val" in a.meta
            and isinstance(a.meta["val"], torch.Tensor)]
    assert kept and not [a for a in kept if a.meta["val"].dtype == torch.int8]


# ---------------------------------------------------------------- a source that does not train


class _Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 48), nn.Linear(32, 48), nn.Linear(32, 48)

    def forward(self, x, use_q: bool = True):
        y = self.k(x) * self.v(x)
        return (y * self.q(x)).sum() if use_q else y.sum()


def _pair():
    torch.manual_seed(0)
    cfg = hot.HOTConfig().replace(seed=3, hla={"share": "siblings"})
    return hot.convert(_Pair(), cfg, backend="reference")


def _codes_per_step(m, x, steps, **kw):
    out = []
    for _ in range(steps):
        got = []
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: got.append(t) or t if t.dtype == torch.int8 else t, lambda t: t):
            y = m(x, **kw)
        y.backward()
        out.append(got)
    return out


def test_a_frozen_first_member_is_no_source():
    """q's weight is frozen and x needs no gradient: q runs no backward and its step counter
    stands still. k becomes the source (v follows it), so the codes change every step: codes
    that followed q's step would repeat, a fixed selection, whose g_W is biased."""
    m = _pair()
    m.q.requires_grad_(False)
    assert abc_source(m.k) is m.k and abc_source(m.v) is m.k
    x = torch.randn(64, 32)
    steps = _codes_per_step(m, x, 3)
    k_codes = [got[0] for got in steps]  # k's (v's are the same tensor eagerly)
    assert int(m.q.hot_step) == 0 and int(m.k.hot_step) == 3
    assert not torch.equal(k_codes[0], k_codes[1]) and not torch.equal(k_codes[1], k_codes[2])
    m.q.requires_grad_(True)  # trains again: the source again
    assert abc_source(m.k) is m.q


def test_a_source_whose_backward_stopped_is_an_error():
    """q trains but its output misses the loss in a step: its counter falls behind k's, and the
    next forward says so instead of repeating q's seeds for k and v."""
    m = _pair()
    x = torch.randn(64, 32)
    _codes_per_step(m, x, 1)
    _codes_per_step(m, x, 1, use_q=False)  # q not called: no backward of q
    with pytest.raises(RuntimeError, match=r"follows the seeds of 'q'.*share='none'"):
        m(x)
