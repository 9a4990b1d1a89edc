"""PNG figures (matplotlib, Agg backend: no display needed).

matplotlib comes with the cli extra; without it every figure is skipped with a one-line note
on stderr and its function returns None, so a run's other results are still written.
"""

from __future__ import annotations

import pathlib
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
    returns the PNG's path, or None without matplotlib."""
    plt = pyplot(path)
    if plt is None:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        loss = r["history"]["step_loss"]
        k = max(1, min(20, len(loss) // 5))
        sm = [sum(loss[max(0, i - k + 1): i + 1]) / len(loss[max(0, i - k + 1): i + 1])
              for i in range(len(loss))]
        a.plot(range(1, len(sm) + 1), sm, label=r["label"])
        ep = r["history"]["epochs"]
        b.plot([e["step"] for e in ep], [100 * e["test_acc"] for e in ep], marker="o",
               label=r["label"])
    a.set(xlabel="step", ylabel=f"training loss (moving average)", title="loss")
    b.set(xlabel="step", ylabel="test accuracy (%)", title="test accuracy after each epoch")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    save(plt, fig, path)
    return str(path)


def memory_bars(layers: list[str], series: dict[str, list[float]], path: pathlib.Path,
                title: str) -> Optional[str]:
    """Grouped horizontal bars: saved bytes (MiB) per layer for each method; returns the PNG's
    path, or None without matplotlib."""
    plt = pyplot(path)
    if plt is None:
        return None
    n, m = len(layers), len(series)
    fig, ax = plt.subplots(figsize=(9, max(3, 0.28 * n * max(1, m / 2) + 1.5)))
    h = 0.8 / max(1, m)
    for j, (name, vals) in enumerate(series.items()):
        ax.barh([i + j * h for i in range(n)], [v / 2**20 for v in vals], height=h, label=name)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(n)], layers, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="bytes saved for backward (MiB)", title=title)
    ax.grid(axis="x", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save(plt, fig, path)
    return str(path)


def save(plt, fig, path: pathlib.Path) -> None:
    """Write ``fig`` to ``path`` as a PNG, atomically, and close it."""
    try:
        atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    finally:
        plt.close(fig)
