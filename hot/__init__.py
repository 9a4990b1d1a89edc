"""hot: Hadamard-based Optimized Training (Kim et al., CVPR 2025) for PyTorch.

HOT changes only the backward pass of nn.Linear and nn.Conv2d layers:

* HQ  (g_x path): 16-point block Hadamard along output channels, 4-bit operands (8-bit where the
  GPU has no INT4 tensor cores, e.g. Hopper, and on CPUs).
* HLA (g_W path): Hadamard low-rank approximation along tokens, r of 16 coefficients, INT8; by
  default the rows are drawn per block so that g_W is unbiased (HOTConfig.paper(): the paper's
  fixed low-pass rows).
* ABC: the forward saves only the INT8 low-rank copy of the layer input.
* LQS: each layer chooses per-token or per-tensor g_y scaling from its own statistics.

    import hot
    hot.convert(model)            # HOTConfig(); HOTConfig.paper(), HOTConfig.exact() (exact grads)
"""

from . import reference  # noqa: F401  (registers the reference backend and the default ops)
from .common.backend import BackendUnavailableError, is_available, register_loader
from .common.config import HLAConfig, HOTConfig, HOTConfigError, HQConfig, LQSConfig
from .nn import (ConvertSummary, HOTConv2d, HOTLayerError, HOTLinear, convert, hot_layers,
                 plain_state_dict, set_config, summary, unconvert)
from . import recipes  # noqa: E402  (after nn: a recipe converts layers)
from .recipes import RECIPES, Cost, Operands, Recipe, RecipeError


def _load_fast() -> None:
    from . import fast  # noqa: F401


register_loader("fast", _load_fast)

__version__ = "0.1.0"

__all__ = [
    "HOTConfig", "HQConfig", "HLAConfig", "LQSConfig", "HOTConfigError",
    "convert", "unconvert", "set_config", "hot_layers", "plain_state_dict", "summary",
    "ConvertSummary", "is_available",
    "HOTLinear", "HOTConv2d", "HOTLayerError", "BackendUnavailableError",
    "recipes", "Recipe", "RECIPES", "RecipeError", "Operands", "Cost",
]
