"""Plots attached to assets: saved as PNG under the home's ``plots/`` and inlined as markdown.

Dagster renders markdown metadata, so a plot travels as a data-URI image; the PNG on disk is
the full-resolution copy a person can open or share.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

SAVED_DPI = 110


class Markdown(str):
    """Text meant to be rendered as markdown (a table, an inline figure) where it is shown."""


INLINE_DPI = 110  # readable in the UI's markdown view (70 dpi was too small to read)


def pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive Agg backend (no display on servers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_markdown(fig: Any, path: Path, alt: str) -> Markdown:
    """Save ``fig`` to ``path`` and return it as an inline markdown image; the figure is closed."""
    plt = pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=SAVED_DPI)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=INLINE_DPI)
    plt.close(fig)
    return image_markdown(buffer.getvalue(), alt)


def image_markdown(png: bytes | Path, alt: str) -> Markdown:
    """PNG bytes (or a PNG file) as an inline markdown image."""
    data = png.read_bytes() if isinstance(png, Path) else png
    return Markdown(f"![{alt}](data:image/png;base64,{base64.b64encode(data).decode()})")


def integer_ticks(*axes: Any, axis: str = "x") -> None:
    """Whole-number ticks on ``axis`` of each matplotlib axes (steps, epochs, iterations are counts)."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


def legend_if_labelled(ax: Any, **kwargs: Any) -> None:
    """``ax.legend(**kwargs)`` when something on ``ax`` has a label (an empty family or round draws
    nothing labelled, and matplotlib warns on a legend of nothing)."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)
