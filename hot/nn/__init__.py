"""HOT layers, their autograd functions, and model conversion."""

from .convert import convert, hot_layers, set_config, unconvert
from .modules import HOTConv2d, HOTLayerError, HOTLinear

__all__ = ["convert", "unconvert", "set_config", "hot_layers", "HOTLinear", "HOTConv2d",
           "HOTLayerError"]
