"""--dataset imagefolder / cifar10 / cifar100, read by torchvision's datasets: the tensors are
the pixels and labels of the files written here, in the documented class order."""

import hashlib
import pickle
import sys

import numpy as np
import pytest
import torch

from hot.data import DataUnavailableError, load_dataset

datasets = pytest.importorskip("torchvision.datasets")
Image = pytest.importorskip("PIL.Image")


def _write(path, a):
    Image.fromarray(a).save(path)
    return a


def _rgb8(path):
    """What the data set must hold for an image file: RGB, resized by PIL's default filter."""
    return np.asarray(Image.open(path).convert("RGB").resize((8, 8))).transpose(2, 0, 1)


def test_imagefolder_train_val_tree(tmp_path):
    rng = np.random.default_rng(0)
    expected = {"train": ([], []), "val": ([], [])}
    # Class order is the sorted folder names: a, b10, b2 (string order, not numeric).
    for split, classes in (("train", ("b2", "a", "b10")), ("val", ("b2", "a"))):  # val lacks b10
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(3):
                _write(tmp_path / split / c / f"{i}.png", rng.integers(0, 256, (8, 8, 3), np.uint8))
    # Other sizes and modes are converted to RGB and resized; GIF counts; other files do not.
    _write(tmp_path / "train" / "a" / "3big.png", rng.integers(0, 256, (13, 21), np.uint8))
    _write(tmp_path / "train" / "b2" / "9.gif", rng.integers(0, 256, (8, 8, 3), np.uint8))
    (tmp_path / "train" / "a" / "notes.txt").write_text("not an image")
    for split, classes in (("train", ("a", "b10", "b2")), ("val", ("a", "b2"))):
        for c in classes:
            for f in sorted(f for f in (tmp_path / split / c).iterdir() if f.suffix != ".txt"):
                expected[split][0].append(_rgb8(f))
                expected[split][1].append(("a", "b10", "b2").index(c))

    d = load_dataset("imagefolder", str(tmp_path), image_size=8)
    assert d.classes == 3 and d.name == f"imagefolder:{tmp_path.name}"
    assert d.x_train.dtype == torch.uint8 and d.y_train.dtype == torch.int64
    assert d.x_train.shape == (11, 3, 8, 8) and d.x_test.shape == (6, 3, 8, 8)
    assert torch.equal(d.x_train, torch.from_numpy(np.stack(expected["train"][0])))
    assert d.y_train.tolist() == expected["train"][1] == [0] * 4 + [1] * 3 + [2] * 4
    assert torch.equal(d.x_test, torch.from_numpy(np.stack(expected["val"][0])))
    assert d.y_test.tolist() == expected["val"][1] == [0] * 3 + [2] * 3  # b2 keeps label 2


def test_imagefolder_flat_tree_holds_out_a_fixed_fifth(tmp_path):
    rng = np.random.default_rng(1)
    written = {}
    for ci, c in enumerate(("cat", "dog", "emu")):
        (tmp_path / c).mkdir()
        for i in range(5):
            a = _write(tmp_path / c / f"{i}.png", rng.integers(0, 256, (8, 8, 3), np.uint8))
            written[a.transpose(2, 0, 1).tobytes()] = ci
    d = load_dataset("imagefolder", str(tmp_path), image_size=8)
    assert (len(d.y_train), len(d.y_test)) == (12, 3)  # round(0.2 * 15) held out
    seen = [(x.numpy().tobytes(), int(y)) for x, y in zip(torch.cat([d.x_train, d.x_test]),
                                                           torch.cat([d.y_train, d.y_test]))]
    assert sorted(seen) == sorted(written.items())  # every image once, with its folder's label
    again = load_dataset("imagefolder", str(tmp_path), image_size=8)
    assert torch.equal(again.x_test, d.x_test)  # the split is fixed


def test_imagefolder_mistakes_are_named(tmp_path):
    img = np.zeros((8, 8, 3), np.uint8)
    for split, c in (("train", "a"), ("val", "a"), ("val", "zebra")):
        (tmp_path / split / c).mkdir(parents=True)
        _write(tmp_path / split / c / "0.png", img)
    with pytest.raises(DataUnavailableError, match=r"\['zebra'\] are not among the training"):
        load_dataset("imagefolder", str(tmp_path))
    (tmp_path / "val" / "zebra" / "0.png").unlink()
    (tmp_path / "val" / "zebra").rmdir()
    (tmp_path / "train" / ".ipynb_checkpoints").mkdir()  # an empty "class" in train
    with pytest.raises(DataUnavailableError, match=r"no valid file for the classes \.ipynb"):
        load_dataset("imagefolder", str(tmp_path))
    with pytest.raises(DataUnavailableError, match="is not a directory"):
        load_dataset("imagefolder", str(tmp_path / "nope"))


def _py2_pickle(d: dict) -> bytes:
    """A dict pickled as Python 2 wrote the official CIFAR files: its keys are py2 `str`, which
    Python 3 reads as bytes or str depending on the encoding asked for."""
    out = b"\x80\x02}("  # PROTO 2, EMPTY_DICT, MARK
    for k, v in d.items():
        out += b"U" + bytes([len(k)]) + k.encode() + pickle.dumps(v, 2)[2:-1]  # SHORT_BINSTRING
    return out + b"u."  # SETITEMS, STOP


def _cifar_tree(folder, cls, rng, classes):
    """Write CIFAR pickles for torchvision class ``cls``; returns {file: (images, labels)}."""
    folder.mkdir(parents=True)
    key = "labels" if cls is datasets.CIFAR10 else "fine_labels"
    written = {}
    for i, (name, _) in enumerate(cls.train_list + cls.test_list):
        x, y = rng.integers(0, 256, (i + 2, 3072), np.uint8), rng.integers(0, classes, i + 2)
        (folder / name).write_bytes(_py2_pickle({"data": x, key: y.tolist()}))
        written[name] = (x.reshape(-1, 3, 32, 32), y)
    (folder / cls.meta["filename"]).write_bytes(
        _py2_pickle({cls.meta["key"]: [f"c{i}" for i in range(classes)]}))
    return written


def _accept_md5(monkeypatch, cls, folder):
    """torchvision checks every file against the official md5: make it expect these files'."""
    md5 = lambda n: hashlib.md5((folder / n).read_bytes()).hexdigest()  # noqa: E731
    monkeypatch.setattr(cls, "train_list", [[n, md5(n)] for n, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[n, md5(n)] for n, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", dict(cls.meta, md5=md5(cls.meta["filename"])))


@pytest.mark.parametrize("which,folder", [(10, "cifar-10-batches-py"), (100, "cifar-100-python"),
                                          (10, "my-copy")])  # my-copy: the files in --data-root
def test_cifar_pickles_give_the_written_images_and_labels(tmp_path, monkeypatch, which, folder):
    cls = datasets.CIFAR10 if which == 10 else datasets.CIFAR100
    root = tmp_path / folder
    written = _cifar_tree(root, cls, np.random.default_rng(which), which)
    _accept_md5(monkeypatch, cls, root)
    d = load_dataset(f"cifar{which}", str(tmp_path if folder != "my-copy" else root))
    train = [written[n] for n, _ in cls.train_list]  # data_batch_1..5 in order, or train
    test = written[cls.test_list[0][0]]
    assert d.name == f"cifar{which}" and d.classes == which
    assert d.x_train.dtype == torch.uint8 and d.x_train.is_contiguous()
    assert torch.equal(d.x_train, torch.from_numpy(np.concatenate([x for x, _ in train])))
    assert d.y_train.tolist() == np.concatenate([y for _, y in train]).tolist()
    assert torch.equal(d.x_test, torch.from_numpy(test[0]))
    assert d.y_test.dtype == torch.int64 and d.y_test.tolist() == test[1].tolist()


def test_cifar_files_that_are_not_the_official_ones_are_refused(tmp_path):
    _cifar_tree(tmp_path / "cifar-10-batches-py", datasets.CIFAR10, np.random.default_rng(0), 10)
    with pytest.raises(DataUnavailableError, match="md5 differs.*extract cifar-10-python"):
        load_dataset("cifar10", str(tmp_path))
    (tmp_path / "cifar-10-batches-py" / "batches.meta").unlink()
    with pytest.raises(DataUnavailableError, match=r"missing batches\.meta"):
        load_dataset("cifar10", str(tmp_path))


def test_without_torchvision_the_error_names_the_extra(tmp_path, monkeypatch):
    for m in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, "torchvision", None)  # `import torchvision` now fails
    for name in ("imagefolder", "cifar100"):
        with pytest.raises(DataUnavailableError, match=r'pip install "\.\[models\]"'):
            load_dataset(name, str(tmp_path))


@pytest.mark.parametrize("which", [10, 100])
def test_foolbox_cifar_samples_are_the_bundled_pngs(which):
    from hot.data.base import package_dir

    files = sorted((package_dir("foolbox", "") / "data").glob(f"cifar{which}_*.png"))
    d = load_dataset(f"foolbox-cifar{which}")
    assert len(files) == 20 and d.classes == which
    assert torch.equal(d.x_train, torch.from_numpy(np.stack(
        [np.asarray(Image.open(f).convert("RGB")).transpose(2, 0, 1) for f in files])))
    assert d.y_train.tolist() == [int(f.stem.rsplit("_", 1)[1]) for f in files]
    assert torch.equal(d.x_test, d.x_train) and d.note  # train = test, and it says so
