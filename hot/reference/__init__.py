"""The reference backend (pure PyTorch, CPU or GPU): importing it registers it."""

from . import ops  # noqa: F401  (registers the backend)
