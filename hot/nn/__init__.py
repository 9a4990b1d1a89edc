"""HOT layers, their autograd functions, and model conversion."""

from .convert import convert, hot_layers, plain_state_dict, set_config, unconvert
from .modules import HOTConv2d, HOTLayerError, HOTLinear
from .summary import ConvertSummary, summary

__all__ = ["convert", "unconvert", "set_config", "hot_layers", "plain_state_dict", "summary",
           "ConvertSummary", "HOTLinear", "HOTConv2d", "HOTLayerError"]
