"""PNG figures (matplotlib, Agg backend: no display needed).

matplotlib comes with the cli extra; without it every figure is skipped with a one-line note
on stderr and its function returns None, so a run's other results are still written.
"""

from __future__ import annotations

import pathlib
import re
from typing import Optional

from ..analysis.records import pyplot
from .outputs import atomic


def available() -> bool:
    """Whether matplotlib can be imported (figures are drawn)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def curves(runs: list[dict], path: pathlib.Path, title: str) -> Optional[str]:
    """Training loss per step (moving average over 20 steps) and test accuracy per epoch;
    returns the PNG's path, or None without matplotlib. With few epochs each accuracy point is
    drawn large and labelled with its value, so that one epoch is not a lone dot."""
    plt = pyplot(path)
    if plt is None:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for k_run, r in enumerate(runs):
        loss = r["history"]["step_loss"]
        k = max(1, min(20, len(loss) // 5))
        sm = [sum(loss[max(0, i - k + 1): i + 1]) / len(loss[max(0, i - k + 1): i + 1])
              for i in range(len(loss))]
        a.plot(range(1, len(sm) + 1), sm, label=r["label"], marker="o" if len(sm) < 3 else None)
        ep = r["history"]["epochs"]
        xs, ys = [e["step"] for e in ep], [100 * e["test_acc"] for e in ep]
        few = len(ep) <= 3
        b.plot(xs, ys, marker="o", ms=8 if few else 5, label=r["label"])
        if few:
            for x, y in zip(xs, ys):
                # one line per run, so that runs at the same point do not overprint
                b.annotate(f"{r['label']} {y:.2f}%", (x, y), xytext=(8, 4 - 12 * k_run),
                           textcoords="offset points", fontsize=8, color=f"C{k_run}")
    a.set(xlabel="step", ylabel="training loss (moving average)", title="loss")
    b.set(xlabel="step", ylabel="test accuracy (%)", title="test accuracy after each epoch")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    save(plt, fig, path)
    return str(path)


def layer_group(name: str) -> str:
    """A layer's group: its name with block indices replaced by * (blocks.3.attn.qkv ->
    blocks.*.attn.qkv), so that a deep model's layers of one role form one bar."""
    return re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", name)


def memory_bars(layers: list[str], series: dict[str, list[float]], path: pathlib.Path,
                title: str, top: int = 12) -> Optional[str]:
    """Saved bytes for backward (MiB): the totals per method first, then the layers grouped by
    role (layer_group), the ``top`` largest groups and the rest as one bar; returns the PNG's
    path, or None without matplotlib."""
    plt = pyplot(path)
    if plt is None:
        return None
    groups: dict[str, list[float]] = {}
    for i, name in enumerate(layers):
        g = groups.setdefault(layer_group(name), [0.0] * len(series))
        for j, vals in enumerate(series.values()):
            g[j] += vals[i]
    order = sorted(groups, key=lambda g: -max(groups[g]))
    if len(order) > top:
        rest = [sum(groups[g][j] for g in order[top:]) for j in range(len(series))]
        groups[f"{len(order) - top} other groups"] = rest
        order = order[:top] + [f"{len(order) - top} other groups"]
    n, m = len(order), len(series)
    fig, (ta, la) = plt.subplots(2, 1, figsize=(9, 2.2 + 0.3 * m + 0.25 * n * max(1, m / 2)),
                                 gridspec_kw={"height_ratios": [max(1, 0.5 * m), max(2, n)]})
    totals = [sum(v) / 2**20 for v in series.values()]
    ta.barh(list(series), totals, color=[f"C{j}" for j in range(m)])
    for j, t in enumerate(totals):
        ta.annotate(f"{t:.2f} MiB", (t, j), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=8)
    ta.invert_yaxis()
    ta.set(xlabel="MiB", title=f"{title}: all Linear/Conv layers")
    h = 0.8 / max(1, m)
    for j, name in enumerate(series):
        vals = [groups[g][j] / 2**20 for g in order]
        la.barh([i + j * h for i in range(n)], vals, height=h, label=name, color=f"C{j}")
    la.set_yticks([i + 0.4 - h / 2 for i in range(n)], order, fontsize=7)
    la.invert_yaxis()
    la.set(xlabel="bytes saved for backward (MiB), summed over the layers of each group",
           title="by layer group (block indices as *)")
    for ax in (ta, la):
        ax.grid(axis="x", alpha=0.3)
    la.legend()
    fig.tight_layout()
    save(plt, fig, path)
    return str(path)


def method_bars(rows: list[dict], path: pathlib.Path, ylabel: str) -> Optional[str]:
    """One bar per row (``setting``, ``mean``, ``sd``): the mean with its sd as an error bar, on
    an axis from 0 (a cut axis would magnify small gaps) and the value written on each bar."""
    plt = pyplot(path)
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(max(4, 1.1 * len(rows) + 1), 4))
    names = [r["setting"] for r in rows]
    means = [r["mean"] for r in rows]
    sds = [r["sd"] if r["sd"] == r["sd"] else 0.0 for r in rows]  # one seed: no sd (NaN)
    bars = ax.bar(names, means, yerr=sds, capsize=4, color=[f"C{j}" for j in range(len(rows))])
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in means], label_type="center", fontsize=8,
                 color="white")
    ax.set_ylim(0, max(m + s for m, s in zip(means, sds)) * 1.08)
    ax.set(ylabel=ylabel, title="mean and sd over seeds")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    save(plt, fig, path)
    return str(path)


def save(plt, fig, path: pathlib.Path) -> None:
    """Write ``fig`` to ``path`` as a PNG, atomically, and close it."""
    try:
        atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    finally:
        plt.close(fig)
