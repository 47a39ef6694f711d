"""Figures as PNG bytes (matplotlib, Agg backend: no display needed), in one consistent style: one
colour per method in every figure (`color`), and one legend per figure, below its panels, where it
covers no data."""

from __future__ import annotations

import contextlib
import io
import re
import zlib
from collections.abc import Callable, Iterator

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.ticker
    from matplotlib import colors as mcolors
    from matplotlib import pyplot as plt
except ImportError:  # the `figures` extra is optional: the report then says figures are left out
    plt = None

#: The colour of each method in every figure of the report (matplotlib's tab10/tab20 hues).
COLORS = {
    "FP16": "#4d4d4d",
    "KIVI-2": "#1f77b4",
    "KIVI-2 +32 sinks": "#17becf",
    "KIVI-1": "#aec7e8",
    "Kitty": "#ff7f0e",
    "Kitty-light": "#ffbb78",
    "PN-Mix": "#d62728",
    "TriAxialKV": "#2ca02c",
    "role-aware PN-Mix": "#9467bd",
    "transformers-quanto": "#8c564b",
    "transformers-hqq": "#e377c2",
}
#: Other names for a method of COLORS (benchmarks.fidelity.equal_bits calls KIVI-2 with 32 sinks "KIVI").
ALIASES = {"KIVI": "KIVI-2 +32 sinks"}
#: Colours of any other series (a model, a scope), picked by a hash of the name: never one of COLORS.
FALLBACK = (
    "#bcbd22",
    "#7f7f7f",
    "#98df8a",
    "#ff9896",
    "#c5b0d5",
    "#c49c94",
    "#f7b6d2",
    "#dbdb8d",
    "#9edae5",
    "#393b79",
    "#637939",
    "#843c39",
)
#: Legend text per inch of figure width at the legend's font size (to choose its number of columns).
_CHARS_PER_INCH = 14


def color(name: str) -> str:
    """The colour of a method (or any series) in every figure. What follows the name in parentheses or
    after a comma does not change it ("FP16 (SDPA)" is FP16's, "PN-Mix, run 2" PN-Mix's); a name
    outside COLORS gets a colour of FALLBACK chosen by a hash that is the same in every run (unlike
    Python's `hash`)."""
    base = re.split(r" \(|, ", name, maxsplit=1)[0].strip()
    base = ALIASES.get(base, base)
    if base in COLORS:
        return COLORS[base]
    return FALLBACK[zlib.crc32(base.encode("utf-8")) % len(FALLBACK)]


MISSING = "Figures left out: matplotlib is not installed (`pip install -e .[figures]`)."


def available() -> bool:
    return plt is not None


def _style(handle) -> tuple:
    """What tells a legend entry apart: colour, line style and marker (a bar: its face colour)."""
    if hasattr(handle, "patches"):  # a bar container
        handle = handle.patches[0]
    elif hasattr(handle, "lines") and handle.lines and handle.lines[0] is not None:  # error bars: their data line
        handle = handle.lines[0]
    if hasattr(handle, "get_linestyle") and hasattr(handle, "get_marker"):
        return mcolors.to_hex(handle.get_color()), handle.get_linestyle(), handle.get_marker()
    face = handle.get_facecolor()
    if getattr(face, "ndim", 1) == 2:  # a collection: one colour per element, the first stands for all
        face = face[0] if len(face) else "none"
    return (mcolors.to_hex(face, keep_alpha=True),)


def legend_entries(axes) -> tuple[list, list[str]]:
    """Each label of the panels once, with its handle. A label given twice in one panel, or to series
    drawn differently in two panels, would name two things: ValueError naming the label."""
    handles: dict[str, object] = {}
    for ax in axes:
        hs, labels = ax.get_legend_handles_labels()
        if len(set(labels)) != len(labels):
            twice = sorted({x for x in labels if labels.count(x) > 1})
            raise ValueError(f"legend labels must be unique within a panel, got {twice} twice")
        for h, label in zip(hs, labels, strict=True):
            if label in handles and _style(handles[label]) != _style(h):
                raise ValueError(f"legend label {label!r} names two differently drawn series")
            handles.setdefault(label, h)
    return list(handles.values()), list(handles)


def _legend_below(fig, axes) -> None:
    """One legend for the whole figure, below its panels (outside every axes, so it covers no point);
    panels that placed their own legend keep it."""
    if any(ax.get_legend() is not None for ax in axes):
        return
    handles, labels = legend_entries(axes)
    if not labels:
        return
    width = fig.get_size_inches()[0] * _CHARS_PER_INCH
    ncol = max(1, min(len(labels), int(width // (max(map(len, labels)) + 6))))
    fig.legend(handles, labels, loc="outside lower center", ncol=ncol, fontsize="small", frameon=False)


#: Characters no font draws (control characters other than a line break), which text from result files may hold.
_UNPRINTABLE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]+")


def _printable(fig) -> None:
    """Replace what no font can draw in every text and series label of `fig` by a space."""
    containers = [c for ax in fig.axes for c in ax.containers]  # error bars and bars: labelled, not in the tree
    for artist in [*fig.findobj(lambda a: hasattr(a, "get_label")), *containers]:
        label = artist.get_label()
        if isinstance(label, str) and _UNPRINTABLE.search(label):
            artist.set_label(_UNPRINTABLE.sub(" ", label))
    for text in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "set_text")):
        if _UNPRINTABLE.search(text.get_text()):
            text.set_text(_UNPRINTABLE.sub(" ", text.get_text()))


def plain_tick(value: float, _position=None) -> str:
    """A log axis's tick as plain text (math text is off in these figures): powers of two from 1024 on
    in K (32K), other values as %g."""
    if value >= 1024 and float(value).is_integer() and int(value) % 1024 == 0:
        return f"{int(value) // 1024}K"
    return f"{value:g}"


def _plain_log_ticks(ax) -> None:
    """Log axes label their ticks with math text ($\\mathdefault{2^{10}}$), which these figures print raw
    (text.parse_math is off: names from result files may hold '$'): plain labels instead."""
    for axis in (ax.xaxis, ax.yaxis):
        if axis.get_scale() == "log":
            axis.set_major_formatter(matplotlib.ticker.FuncFormatter(plain_tick))
            axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


@contextlib.contextmanager
def drawn(draw: Callable, *, ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.4, 4.0)) -> Iterator:
    """A new matplotlib figure of `nrows` x `ncols` panels (`size` each) drawn by draw(*axes), row by row, with
    grids and its legend below the panels; closed on exit."""
    # names and devices come from result files: a '$' in one is text, not the start of a formula that may not parse
    with matplotlib.rc_context({"text.parse_math": False}):
        fig, grid = plt.subplots(
            nrows, ncols, figsize=(size[0] * ncols, size[1] * nrows), squeeze=False, layout="constrained"
        )
        axes = list(grid.flat)
        try:
            draw(*axes)
            _printable(fig)
            for ax in axes:
                ax.grid(True, alpha=0.3)
                _plain_log_ticks(ax)
            _legend_below(fig, axes)
            yield fig
        finally:
            plt.close(fig)


def png(draw: Callable, *, ncols: int = 1, nrows: int = 1, size: tuple[float, float] = (6.4, 4.0)) -> bytes | None:
    """Call draw(*axes) on a new figure of `nrows` x `ncols` panels and return it as PNG bytes (None without
    matplotlib)."""
    if plt is None:
        return None
    with drawn(draw, ncols=ncols, nrows=nrows, size=size) as fig:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})  # no version stamp: stable bytes
        return buf.getvalue()
