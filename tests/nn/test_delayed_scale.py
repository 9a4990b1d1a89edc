"""HLAConfig(amax="delayed") in HOT layers (reference backend, CPU): the configuration's checks,
the histories a layer keeps (where they live, what they hold after a step, what moves them),
the first step equal to the paper's scales, eager against compiled training, and the window of
quant.delayed_scale."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn as nn

import hot
from hot.common import quant
from hot.common.transforms import hla_transform
from hot.nn.state import ABC_X, GY_HLA

from hot_testing import grads, hot_copy, wrap

DELAYED = hot.HOTConfig(seed=3, hla=hot.HLAConfig(amax="delayed", selection="lowpass"))
CURRENT = hot.HOTConfig(seed=3, hla=hot.HLAConfig(selection="lowpass"))


def test_config_checks_name_the_field_and_the_fix():
    for kw in (dict(scale="tensor"), dict(bits=None)):
        with pytest.raises(hot.HOTConfigError, match="amax='delayed'"):
            hot.HLAConfig(amax="delayed", **kw)
    with pytest.raises(hot.HOTConfigError, match="HLAConfig.amax"):
        hot.HLAConfig(amax="previous")
    with pytest.raises(hot.HOTConfigError, match="method='int4'"):
        hot.HOTConfig(method="int4", hla=hot.HLAConfig(amax="delayed", selection="lowpass"))


def test_window_of_the_delayed_scale():
    """c = 4 h is kept exactly for a in [c / 16, c]; elsewhere, and for h = 0, NaN or Inf, the
    scale is a's own (1 for a = 0)."""
    assert (quant.DELAYED_MARGIN, quant.DELAYED_RANGE) == (4.0, 16.0)
    h = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, float("nan"), float("inf"), 1.0, 1.0])
    a = torch.tensor([4.0, 0.25, 4.0001, 0.2499, 1.3, 1.0, 1.0, 1.0, float("nan"), 0.0])
    keep = quant.delayed_keep(a, h)
    assert keep.tolist() == [True, True, False, False, True, False, False, False, False, False]
    s = quant.delayed_scale(a, h, 8)
    assert torch.equal(s[keep], torch.full((3,), 4.0) / 127)
    own = ~keep
    want = torch.where(a == 0, torch.ones_like(a), a / 127)
    assert torch.equal(s[own][:-2], want[own][:-2]) and torch.isnan(s[8]) and s[9] == 1.0


def _layer(cfg):
    torch.manual_seed(0)
    return hot_copy(wrap(nn.Linear(40, 24)), cfg)


def _xg(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(64, 40, generator=g), torch.randn(64, 24, generator=g)


def test_histories_are_made_with_the_config_and_hold_each_channels_absmax():
    m = _layer(DELAYED)
    layer = m[0]
    assert set(layer._hot_hist) == {ABC_X, GY_HLA}
    assert all(not h.any() for h in layer._hot_hist.values())
    x, gy = _xg(0)
    grads(m, x.requires_grad_(), gy)
    # After one step: the channel absmax of x's and of g_y's HLA coefficients (rank 8).
    want_x = quant.absmax(hla_transform(x, 8, "lowpass"), "row").reshape(-1)
    want_g = quant.absmax(hla_transform(gy, 8, "lowpass"), "row").reshape(-1)
    assert torch.equal(layer._hot_hist[ABC_X], want_x)
    assert torch.equal(layer._hot_hist[GY_HLA], want_g)
    # Not buffers (DDP would broadcast them), but in the state dict (resuming needs them).
    assert not any("hist" in n for n, _ in m.named_buffers())
    sd = m.state_dict()
    assert torch.equal(sd["0.hot_hist_x"], want_x) and torch.equal(sd["0.hot_hist_gy"], want_g)
    # The paper's config keeps none.
    assert not _layer(CURRENT)[0]._hot_hist


def test_first_step_equals_the_papers_scales_then_differs():
    """With no history every channel takes its own absmax: the first step's gradients are the
    paper's, bit for bit; on the second the candidates 4 h / qmax are kept (the inputs are
    alike), so g_W differs while g_x (HQ) stays the same."""
    md, mc = _layer(DELAYED), _layer(CURRENT)
    for step in range(2):
        x, gy = _xg(step)
        gxd, gd = grads(md, x.requires_grad_(), gy)
        gxc, gc = grads(mc, x.requires_grad_(), gy)
        assert torch.equal(gxd, gxc)
        assert torch.equal(gd["0.bias"], gc["0.bias"])
        if step == 0:
            assert torch.equal(gd["0.weight"], gc["0.weight"])
        else:
            assert not torch.equal(gd["0.weight"], gc["0.weight"])
            # both estimate the same gradient: within a few of HLA's own errors of each other
            exact = gy.t() @ x
            err_c = (gc["0.weight"] - exact).norm()
            assert (gd["0.weight"] - exact).norm() < 2 * err_c


def test_histories_move_and_stay_float32():
    m = _layer(DELAYED)
    grads(m, _xg(0)[0].requires_grad_(), _xg(0)[1])
    layer = m[0]
    before = layer._hot_hist[ABC_X].clone()
    assert before.any()
    m.float()  # a move that keeps the dtype keeps the contents
    assert torch.equal(layer._hot_hist[ABC_X], before)
    m.to(torch.float64)
    assert layer._hot_hist[ABC_X].dtype == torch.float32
    assert not layer._hot_hist[ABC_X].any()  # a cast starts them afresh
    m.to(torch.float32)
    c = copy.deepcopy(m)
    grads(c, _xg(1)[0].requires_grad_(), _xg(1)[1])
    assert not layer._hot_hist[ABC_X].any()  # the copy's histories are its own
    assert c[0]._hot_hist[ABC_X].any()


def test_set_config_makes_histories():
    m = _layer(CURRENT)
    hot.set_config(m, DELAYED)
    assert set(m[0]._hot_hist) == {ABC_X, GY_HLA}


def test_compiled_training_equals_eager():
    torch._dynamo.reset()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 48), nn.GELU(), nn.Linear(48, 16))
    me = hot_copy(base, DELAYED)
    mc = hot_copy(base, DELAYED)
    fc = torch.compile(mc, backend="aot_eager", fullgraph=True)
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        x, t = torch.randn(4, 16, 32, generator=g), torch.randn(4, 16, 16, generator=g)
        for mod, fwd in ((me, me), (mc, fc)):
            mod.zero_grad(set_to_none=True)
            (fwd(x) - t).square().mean().backward()
        for (n, pe), (_, pc) in zip(me.named_parameters(), mc.named_parameters()):
            assert torch.equal(pe.grad, pc.grad), f"step {step}: {n}"
        for le, lc in zip(hot.hot_layers(me), hot.hot_layers(mc)):
            for k in (ABC_X, GY_HLA):
                assert torch.equal(le[1]._hot_hist[k], lc[1]._hot_hist[k])
    torch._dynamo.reset()


def test_cli_flag_sets_the_config_and_baselines_refuse_it():
    import argparse

    from hot.cli.common import add_hot_args, hot_config
    from hot.cli.errors import CLIError

    p = argparse.ArgumentParser()
    add_hot_args(p)
    p.add_argument("--method", default="hot")
    delayed = ["--hla-amax", "delayed", "--hla-selection", "lowpass"]
    assert hot_config(p.parse_args(delayed)).hla.amax == "delayed"
    assert hot_config(p.parse_args([])).hla.amax == "current"
    with pytest.raises(CLIError, match="--hla-amax"):
        hot_config(p.parse_args(["--method", "int4", "--hla-amax", "delayed"]))


class _Block(nn.Module):
    """A residual MLP block; ``twice``: its up-projection is applied twice (shared weights)."""

    def __init__(self, twice: bool = False):
        super().__init__()
        self.twice = twice
        self.norm, self.up, self.down = nn.LayerNorm(32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        h = torch.relu(self.up(self.norm(x)))
        if self.twice:
            h = torch.relu(self.up(h))
        return x + self.down(h)


class _Net(nn.Module):
    """Two blocks; ``twice``: "block" (a layer applied twice inside each block) or "net" (one
    block applied twice, each application a checkpointed region of its own)."""

    def __init__(self, twice: str = ""):
        super().__init__()
        shared = _Block()
        self.blocks = nn.ModuleList([shared, shared] if twice == "net" else
                                    [_Block(twice == "block") for _ in range(2)])
        self.ckpt = None  # None: no checkpointing; else use_reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for b in self.blocks:
            x = b(x) if self.ckpt is None else checkpoint(b, x, use_reentrant=self.ckpt)
        return x


def _train_grads(model, steps: int = 3):
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(steps):
        x = torch.randn(4, 16, 32, generator=g, requires_grad=True)
        model.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        out.append({k: p.grad.clone() for k, p in model.named_parameters()})
    return out


@pytest.mark.parametrize("twice", ["", "block"])
@pytest.mark.parametrize("abc", ["save", "recompute"])
@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_training_equals_plain(reentrant, abc, twice):
    """The re-run forward of a checkpointed block forms x's codes with the history its original
    forward read (not the one that forward left), and leaves the history as the original did:
    gradients and histories equal those without checkpointing, bit for bit, over several steps;
    also for a layer applied twice in one checkpointed region (its second call sees the first
    call's update)."""
    _assert_checkpointed_equals_plain(_Net(twice), DELAYED.replace(hla={"abc": abc}), reentrant)


def test_block_applied_in_two_checkpointed_regions():
    """One block applied twice, each application checkpointed: the second region re-runs first,
    and its layers' re-runs take their own calls' histories (not the first call's). Rounding to
    nearest: a stochastic seed follows the layer's step, which the second call's backward has
    advanced when the first region re-runs, with either amax."""
    nearest = DELAYED.replace(hla={"rounding": "nearest"},
                              hq={"gy_rounding": "nearest", "w_rounding": "nearest"})
    _assert_checkpointed_equals_plain(_Net("net"), nearest, False)


def _assert_checkpointed_equals_plain(base, cfg, reentrant):
    torch.manual_seed(0)
    runs, hists = [], []
    for ckpt in (None, reentrant):
        m = hot_copy(base, cfg)
        m.ckpt = ckpt
        runs.append(_train_grads(m))
        hists.append([layer._hot_hist[k] for _, layer in hot.hot_layers(m)
                      for k in (ABC_X, GY_HLA)])
    for step, (a, b) in enumerate(zip(*runs)):
        for k in a:
            assert torch.equal(a[k], b[k]), f"step {step}: {k}"
    for a, b in zip(*hists):
        assert a.any() and torch.equal(a, b)


def _steps(model, opt, start: int, stop: int):
    """Train steps [start, stop) on data drawn from the step number; the last step's grads."""
    out = None
    for step in range(start, stop):
        g = torch.Generator().manual_seed(100 + step)
        x, t = torch.randn(4, 16, 32, generator=g), torch.randn(4, 16, 32, generator=g)
        opt.zero_grad(set_to_none=True)
        (model(x) - t).square().mean().backward()
        opt.step()
        out = {k: p.grad.clone() for k, p in model.named_parameters()}
    return out


def test_resume_from_a_checkpoint_continues_bit_for_bit(tmp_path):
    """Train 3 steps, save model and optimizer, restore them into a fresh model, train 3 more:
    parameters, gradients and histories equal those of 6 uninterrupted steps. The histories
    are in the state dict (hot_hist_x, hot_hist_gy), not in the plain one."""
    torch.manual_seed(0)
    base = _Net()

    def fresh():
        m = hot_copy(base, DELAYED)
        return m, torch.optim.SGD(m.parameters(), lr=0.1)

    ref, ref_opt = fresh()
    _steps(ref, ref_opt, 0, 3)
    want_grads = _steps(ref, ref_opt, 3, 6)

    first, opt = fresh()
    _steps(first, opt, 0, 3)
    sd = first.state_dict()
    assert {k.rpartition(".")[2] for k in sd if "hist" in k} == {"hot_hist_x", "hot_hist_gy"}
    assert not any("hist" in k for k in hot.plain_state_dict(first))
    torch.save({"model": sd, "optimizer": opt.state_dict()}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    resumed, opt = fresh()
    resumed.load_state_dict(ck["model"])
    opt.load_state_dict(ck["optimizer"])
    got_grads = _steps(resumed, opt, 3, 6)
    for k in want_grads:
        assert torch.equal(got_grads[k], want_grads[k]), k
    for (n, a), (_, b) in zip(ref.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), n


def test_histories_in_the_state_dict_load_strictly_and_are_checked():
    m = _layer(DELAYED)
    grads(m, _xg(0)[0].requires_grad_(), _xg(0)[1])
    sd = m.state_dict()
    # into a layer of amax "current" (not its state: left) and into the plain layer (no HOT keys)
    other = _layer(CURRENT)
    other.load_state_dict(sd)
    assert not any("hist" in k for k in other.state_dict())
    nn.Sequential(nn.Linear(40, 24)).load_state_dict(hot.plain_state_dict(m))
    # into a fresh delayed layer: its histories are the checkpoint's
    fresh = _layer(DELAYED)
    fresh.load_state_dict(sd)
    assert torch.equal(fresh[0]._hot_hist[ABC_X], m[0]._hot_hist[ABC_X])
    bad = dict(sd, **{"0.hot_hist_x": torch.zeros(3)})
    with pytest.raises(RuntimeError, match=r"HOT layer '0': 0.hot_hist_x must be 40 floats"):
        fresh.load_state_dict(bad)


def test_hf_save_leaves_the_histories_out():
    from hot.nn import hfsave

    class Model(nn.Module):  # the two things hfsave looks for in a transformers model
        _keys_to_ignore_on_save = None

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(40, 24)

        def save_pretrained(self, path):
            pass

    m = hot.convert(Model(), DELAYED, backend="reference", convert_head=True)
    hfsave.refresh(m)
    assert {"fc.hot_hist_x", "fc.hot_hist_gy"} <= set(m._keys_to_ignore_on_save)
