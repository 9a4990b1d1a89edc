"""hot.summary(model): which Linear / Conv2d layers run HOT's backward, and why the others don't.

peft's print_trainable_parameters is the model: one object, printed as a short table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn as nn
from torch.nn.parameter import is_lazy

from .modules import HOTConv2d, HOTLinear
from .selection import linear_or_conv, output_head, reason_left
from .state import is_narrow

# Where convert leaves, on the model it converted, {fqn: reason} of the layers it left alone
# (the filter's verdicts cannot be recomputed later: the filter is not kept).
RECORD = "_hot_left_alone"
NOT_CONVERTED = "not converted (hot.convert did not see it)"
EXACT = "converted, exact (narrower than min_in_features)"


@dataclass(frozen=True)
class ConvertSummary:
    """converted: HOT layers running HOT's backward; exact: HOT layers narrower than their
    config's min_in_features (their backward is exact); left: {reason: layer names} of the
    Linear / Conv2d layers left as they are; weights: {layer name: weight elements};
    quantized_forward: the converted layers whose forward GEMM is quantized too
    (HOTConfig.forward)."""

    converted: tuple = ()
    exact: tuple = ()
    left: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)
    quantized_forward: tuple = ()

    @property
    def total(self) -> int:
        return len(self.converted) + len(self.exact) + sum(len(v) for v in self.left.values())

    def rows(self):
        """(status, layer names) in the table's order: converted first."""
        out = [("converted", self.converted)]
        if self.exact:
            out.append((EXACT, self.exact))
        out += [(f"left: {why}", names) for why, names in sorted(self.left.items())]
        return out

    def to_dict(self) -> dict:
        return {"converted": list(self.converted), "exact": list(self.exact),
                "left": {k: list(v) for k, v in self.left.items()},
                "quantized_forward": list(self.quantized_forward)}

    def __str__(self) -> str:
        all_w = sum(self.weights.values())
        hot_w = sum(self.weights[n] for n in self.converted)
        share = f" ({100 * hot_w / all_w:.1f}% of their weights)" if all_w else ""
        qf = (f"; forward GEMM quantized too on {len(self.quantized_forward)} of them"
              if self.quantized_forward else "")
        lines = [f"HOT backward on {len(self.converted)} of {self.total} Linear/Conv2d "
                 f"layers{share}{qf}"]
        lines.append(f"  {'layers':>6}  {'weights':>11}  status: names")
        for status, names in self.rows():
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            w = sum(self.weights[n] for n in names)
            lines.append(f"  {len(names):>6}  {w:>11,}  {status}: {shown or '-'}")
        return "\n".join(lines)

    __repr__ = __str__


def summary(model: nn.Module) -> ConvertSummary:
    """What ``hot.convert`` made of ``model``: its HOT layers, and every other nn.Linear /
    nn.Conv2d by the reason it was left alone (those convert never saw: 'not converted')."""
    record = model.__dict__.get(RECORD, {})
    head = output_head(model)
    parents = dict(model.named_modules())
    converted, exact, left, weights, quantized = [], [], {}, {}, []
    for fqn, mod in linear_or_conv(model):
        name = fqn or "<root>"
        weights[name] = 0 if is_lazy(mod.weight) else mod.weight.numel()
        if isinstance(mod, (HOTLinear, HOTConv2d)):
            narrow = is_narrow(mod, mod.hot_config)
            (exact if narrow else converted).append(name)
            if not narrow and mod.hot_config.forward != "exact":
                quantized.append(name)
            continue
        why = record.get(name) or reason_left(fqn, mod, parents.get(fqn.rpartition(".")[0]),
                                              head, False, False) or NOT_CONVERTED
        left.setdefault(why, []).append(name)
    return ConvertSummary(tuple(converted), tuple(exact), {k: tuple(v) for k, v in left.items()},
                          weights, tuple(quantized))
