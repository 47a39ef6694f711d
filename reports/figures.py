"""Figures as PNG bytes (matplotlib, Agg backend: no display needed), in one consistent style."""

from __future__ import annotations

import io
from collections.abc import Callable

from reference.methods import NAMES

try:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
except ImportError:  # the `figures` extra is optional: the report then says figures are left out
    plt = None


def color(method: str) -> str:
    """One color per method across every figure (FP16 variants such as "FP16 (SDPA)" share FP16's)."""
    base = "FP16" if method.startswith("FP16") else method
    return f"C{NAMES.index(base)}" if base in NAMES else "C9"


MISSING = "Figures left out: matplotlib is not installed (`pip install -e .[figures]`)."


def available() -> bool:
    return plt is not None


def png(draw: Callable, *, ncols: int = 1, size: tuple[float, float] = (6.4, 4.0)) -> bytes | None:
    """Call draw(axes) on a new figure of `ncols` panels and return it as PNG bytes (None without matplotlib)."""
    if plt is None:
        return None
    fig, axes = plt.subplots(1, ncols, figsize=(size[0] * ncols, size[1]), squeeze=False)
    try:
        draw(*axes[0])
        for ax in axes[0]:
            ax.grid(True, alpha=0.3)
            if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize="small")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})  # no version stamp: stable bytes
        return buf.getvalue()
    finally:
        plt.close(fig)
