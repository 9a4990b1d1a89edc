"""Image data sets under a local path, read by torchvision's datasets: CIFAR-10/100 from the
official python pickles and ImageFolder trees (ROOT/<class>/<image>).

torchvision is imported only here, only when one of these is asked for, and always with
``download=False``: nothing is fetched. The images end up as ImageData's in-memory uint8 tensors
(N, C, H, W), the same as every other image source, so training does not change.
"""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from .base import DataUnavailableError, ImageData, split_sizes

INSTALL = 'pip install ".[models]"'  # the extra that brings torchvision (with timm)


def _torchvision(what: str):
    """torchvision.datasets and torchvision.transforms, or an error saying how to install them."""
    try:
        from torchvision import datasets, transforms
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] != "torchvision":
            raise  # a dependency of torchvision (pillow...): the CLI names that package
        raise DataUnavailableError(f"{what} is read by torchvision, which is not installed: run "
                                   f"`{INSTALL}` (or pip install the torchvision built for your "
                                   f"torch).") from e
    return datasets, transforms


def cifar_pickles(root: str, which: int = 10) -> ImageData:
    """CIFAR-10/100 from the official python pickles under ``root`` (in cifar-10-batches-py/ or
    cifar-100-python/, or those files directly in ``root``), read by torchvision's CIFAR10 /
    CIFAR100, which also checks each file's md5 against the official one."""
    datasets, _ = _torchvision(f"--dataset cifar{which}")
    cls = datasets.CIFAR10 if which == 10 else datasets.CIFAR100
    base = pathlib.Path(root).resolve()
    folder = base / cls.base_folder if (base / cls.base_folder).is_dir() else base
    names = [n for n, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataUnavailableError(
            f"CIFAR-{which} python pickles not found under {root} (missing {', '.join(missing)} in "
            f"{folder}): extract cifar-{which}-python.tar.gz from "
            f"https://www.cs.toronto.edu/~kriz/cifar.html there yourself (nothing is downloaded), "
            f"or use --dataset foolbox-cifar{which} for a smoke run.")
    # torchvision reads root/<base_folder>/; naming the folder the files were found in reads
    # them where they lie (a renamed folder, or the files directly in --data-root) without a copy.
    here = type(cls.__name__, (cls,), {"base_folder": folder.name})
    try:
        train, test = here(str(folder.parent), train=True), here(str(folder.parent), train=False)
    except RuntimeError as e:  # torchvision's md5 check ("not found or corrupted")
        raise DataUnavailableError(
            f"the CIFAR-{which} files in {folder} are not the official python pickles (their md5 "
            f"differs): extract cifar-{which}-python.tar.gz there again.") from e

    def tensors(ds):
        x = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))  # NHWC -> NCHW
        return x, torch.tensor(ds.targets, dtype=torch.int64)

    return ImageData(f"cifar{which}", *tensors(train), *tensors(test), which,
                     mean=(0.49, 0.48, 0.45), std=(0.25, 0.24, 0.26))


def image_folder(root: str, image_size: int = 32, test_fraction: float = 0.2,
                 seed: int = 0) -> ImageData:
    """ROOT/<class>/<image> (or ROOT/train and ROOT/val|test with that layout), read by
    torchvision's ImageFolder, every image resized to ``image_size`` square RGB. Classes are the
    sorted folder names. Without a split folder, a random ``test_fraction`` (fixed ``seed``) is
    held out."""
    datasets, transforms = _torchvision("--dataset imagefolder")
    base = pathlib.Path(root)
    if not base.is_dir():
        raise DataUnavailableError(f"ImageFolder root {root!r} is not a directory: pass "
                                   f"--data-root DIR with one sub-folder of images per class.")
    # Bicubic: PIL's own default for Image.resize, so the tensors stay what they always were.
    bicubic = transforms.InterpolationMode.BICUBIC
    tf = transforms.Compose([transforms.Resize((image_size, image_size), interpolation=bicubic),
                             transforms.PILToTensor()])
    test_dir = next((base / n for n in ("val", "test") if (base / n).is_dir()), None)
    if (base / "train").is_dir() and test_dir is not None:
        xtr, ytr, classes = _read_folder(datasets, base / "train", tf)
        xte, yte, _ = _read_folder(datasets, test_dir, tf, classes)
    else:
        x, y, classes = _read_folder(datasets, base, tf)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        _, n_test = split_sizes(len(y), test_fraction)
        xte, yte, xtr, ytr = x[perm[:n_test]], y[perm[:n_test]], x[perm[n_test:]], y[perm[n_test:]]
    return ImageData(f"imagefolder:{base.name}", xtr, ytr, xte, yte, len(classes),
                     mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))


# torchvision's image extensions, plus GIF (read by PIL like the rest).
IMG_EXT = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


def _read_folder(datasets, d: pathlib.Path, tf, classes=None):
    """(uint8 images, int64 labels, class names) of the ImageFolder tree ``d``. With ``classes``
    (a test split), labels index that list: a split may lack a class, never add one."""
    from PIL import UnidentifiedImageError

    hint = f"expected {d}/<class>/<image> with one of {', '.join(IMG_EXT)}"
    try:
        ds = datasets.ImageFolder(str(d), transform=tf, allow_empty=classes is not None,
                                  is_valid_file=lambda p: p.lower().endswith(IMG_EXT))
    except FileNotFoundError as e:  # no class folder, or a class folder without images
        raise DataUnavailableError(f"ImageFolder {d}: {str(e).rstrip('. ')} ({hint}).") from e
    if classes is None:
        classes = ds.classes
    unknown = [c for c in ds.classes if c not in classes]
    if unknown:
        raise DataUnavailableError(f"ImageFolder {d}: class folders {unknown} are not among the "
                                   f"training classes {classes}: rename or remove them.")
    if len(ds) == 0:
        raise DataUnavailableError(f"no images found under {d}: {hint}.")
    try:
        pairs = [ds[i] for i in range(len(ds))]
    except UnidentifiedImageError as e:
        raise DataUnavailableError(f"ImageFolder {d}: {e}: remove or replace that file.") from e
    to_train = torch.tensor([classes.index(c) for c in ds.classes], dtype=torch.int64)
    x = torch.stack([p[0] for p in pairs])
    y = to_train[torch.tensor([p[1] for p in pairs], dtype=torch.int64)]
    return x, y, classes
