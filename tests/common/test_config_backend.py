"""HOTConfig validation and backend selection: bad values fail early, naming the value."""

import pytest
import torch

import hot
from hot import BackendUnavailableError, HLAConfig, HOTConfig, HOTConfigError, HQConfig, LQSConfig
from hot.common import backend


@pytest.mark.parametrize("bits", [0, 1, 2, 3, 5, 6, 16, 32])
def test_bits_other_than_4_or_8_rejected(bits):
    with pytest.raises(HOTConfigError, match=rf"HQConfig\.bits={bits}\b"):
        HQConfig(bits=bits)
    with pytest.raises(HOTConfigError, match=rf"HLAConfig\.bits={bits}\b"):
        HLAConfig(bits=bits)


@pytest.mark.parametrize("rank", [0, 3, 5, 7, 12, 32, -1])
def test_rank_outside_valid_set_rejected(rank):
    with pytest.raises(HOTConfigError, match=rf"HLAConfig\.rank={rank}\b"):
        HLAConfig(rank=rank)
    with pytest.raises(HOTConfigError, match=rf"rank={rank}\b"):
        HOTConfig().replace(hla={"rank": rank})


@pytest.mark.parametrize("field,value", [
    ("gy_scale", "channel"), ("w_scale", "token"), ("gy_rounding", "floor"),
])
def test_bad_hq_choice_names_value(field, value):
    with pytest.raises(HOTConfigError, match=value):
        HQConfig(**{field: value})


@pytest.mark.parametrize("kw", [{"ratio": 0.0}, {"ratio": 1.5}, {"calibration_steps": 0}])
def test_bad_lqs_values(kw):
    (name, value), = kw.items()
    with pytest.raises(HOTConfigError, match=f"{name}={value}"):
        LQSConfig(**kw)


@pytest.mark.parametrize("name", ["exact_steps", "int8_steps", "exact_from"])
def test_negative_schedule_rejected(name):
    with pytest.raises(HOTConfigError, match=f"{name}=-1"):
        HOTConfig(**{name: -1})


def test_exact_from_phases():
    c = HOTConfig(exact_steps=2, exact_from=5)
    assert [c.exact_at(s) for s in range(7)] == [True, True, False, False, False, True, True]
    assert not any(HOTConfig().exact_at(s) for s in (0, 10**9))
    assert HOTConfig.from_dict(c.to_dict()) == c
    with pytest.raises(HOTConfigError, match="exact_from=2.5"):
        HOTConfig(exact_from=2.5)


def test_hlq_preset_is_the_paper_without_abc_and_lqs():
    h = HOTConfig.hlq()
    assert (h.hq.gy_scale, h.hla.abc) == ("token", "recompute")
    assert h.replace(hq={"gy_scale": "auto"}, hla={"abc": "auto"}) == HOTConfig.paper()


def test_paper_and_exact_presets():
    p = HOTConfig.paper()
    assert (p.hq.bits, p.hla.rank, p.hla.bits, p.hla.selection, p.hq.gy_scale) == \
        (4, 8, 8, "lowpass", "auto")
    d = HOTConfig()  # the paper's method with drawn HLA rows and HQ's width by device
    assert d == p.replace(hq={"bits": "auto"}, hla={"selection": "auto"})
    e = HOTConfig.exact()
    assert (e.hq.bits, e.hla.rank, e.hla.bits) == (None, 16, None)
    assert HOTConfig.from_dict(d.replace(int8_steps=3, hla={"rank": 4}).to_dict()) == \
        HOTConfig(int8_steps=3, hla=HLAConfig(rank=4))


def test_unknown_backend_argument_names_value():
    with pytest.raises(BackendUnavailableError, match="'foo'"):
        hot.convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), backend="foo")


def test_unknown_backend_env_var_names_value_and_source():
    from hot.common.options import OptionsError, from_env

    with pytest.raises(OptionsError, match=r"HOT_BACKEND='foo' is not one of"):
        from_env({"HOT_BACKEND": "foo"})
    with pytest.raises(BackendUnavailableError, match="backend='foo'"):
        backend.resolve_backend("foo", torch.device("cpu"))
    with pytest.raises(BackendUnavailableError, match="backend='foo'"):
        hot.convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), backend="foo")


def test_fast_requested_where_it_cannot_run_fails_at_first_forward_naming_layer():
    """On a CPU tensor the fast backend (GPU kernels) cannot run, built or not."""
    model = hot.convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), backend="fast")
    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(BackendUnavailableError, match=r"'fast'.*'0'.*reference"):
        model(x)


def test_fast_via_env_fails_and_auto_falls_back():
    from hot.common.options import BackendName, from_env, override

    assert from_env({"HOT_BACKEND": " Fast "}).backend == BackendName.FAST
    with override(backend=BackendName.FAST):
        with pytest.raises(BackendUnavailableError, match="fast.*'blk.fc'"):
            backend.resolve_backend(None, torch.device("cpu"), "blk.fc")
    with override(backend=BackendName.AUTO):
        assert backend.resolve_backend(None, torch.device("cpu")) == "reference"
        assert backend.resolve_backend("reference", torch.device("cpu")) == "reference"


def test_auto_picks_fast_where_it_can_run(monkeypatch):
    # Pretend the device can run the fast kernels: 'auto' and 'fast' both pick it; 'reference'
    # stays the reference.
    from hot.common.backend import get_backend, resolve_backend

    get_backend("fast")  # imports and registers it
    monkeypatch.setitem(backend._REGISTRY, "fast", backend.Backend("fast", lambda device: None))
    dev = torch.device("cpu")
    assert resolve_backend("auto", dev) == "fast"
    assert resolve_backend("fast", dev) == "fast"
    assert resolve_backend("reference", dev) == "reference"


def test_is_available_says_why_fast_cannot_run_on_the_cpu():
    ok, why = hot.is_available("fast", "cpu", return_reason=True)
    assert ok is False and "cpu" in why
    assert hot.is_available("fast", torch.device("cpu")) is False
    assert hot.is_available("reference", "cpu", return_reason=True) == (True, None)
    ok, why = hot.is_available("auto", "cpu", return_reason=True)
    assert ok is True and "reference" in why and "cpu" in why
    with pytest.raises(BackendUnavailableError, match="'fastest'"):
        hot.is_available("fastest")
