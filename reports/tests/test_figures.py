"""Figures: one colour per method in every figure, legends whose labels name one series each and that
cover no data, the paper's points labelled with the paper's GPU."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reference import paper
from reference.methods import NAMES, TOKEN_METHODS
from reports import figures, inputs
from reports.sections import equal_bits, fidelity, memory
from reports.tests import synthetic

pytest.importorskip("matplotlib")
from matplotlib import colors as mcolors
from matplotlib.container import BarContainer

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
COMMITTED_FIDELITY = max(RESULTS.glob("fidelity-*.json"))
COMMITTED_EQUAL_BITS = sorted(RESULTS.glob("equal-bits-*.json"))  # matched on bits, and on stored memory


@pytest.fixture
def drawn(monkeypatch):
    """The figures the sections draw, in order, kept open for inspection instead of saved as PNG."""
    kept = []
    with contextlib.ExitStack() as stack:

        def png(draw, *, ncols=1, size=(6.4, 4.0)):
            kept.append(stack.enter_context(figures.drawn(draw, ncols=ncols, size=size)))
            return b"\x89PNG\r\n\x1a\n"

        monkeypatch.setattr(figures, "png", png)
        yield kept


def _long_output(tmp_path, name, positions, date):
    per_prompt = [
        {
            m: {"kl": [0.1 * (i + 1)] * positions, "top1": [1.0] * positions, "nll": [1.0] * positions}
            for i, m in enumerate(("KIVI-2 +32 sinks", "Kitty", "PN-Mix"))
        }
    ]
    per_prompt[0]["FP16"] = {"nll": [0.5] * positions}
    data = synthetic.long_output(per_prompt, 4)
    data["date_utc"] = date
    return inputs.load(synthetic.write(tmp_path, name, data), "--input")


@pytest.fixture
def every_figure(drawn, tmp_path):
    """Every figure of the memory, fidelity (two long-output runs) and equal-bits sections."""
    memory.render([])
    full = inputs.load(COMMITTED_FIDELITY, "committed")
    longs = [
        _long_output(tmp_path, "a.json", 16, "2026-12-01T00:00:00+00:00"),
        _long_output(tmp_path, "b.json", 32, "2026-12-02T00:00:00+00:00"),
    ]
    section = fidelity.render([full], "", longs)
    runs = [inputs.load(p, "committed") for p in COMMITTED_EQUAL_BITS]
    equal_bits.render(runs)
    models = {
        s.data.get("model_fingerprint") or s.data.get("model") for s in runs if "--smoke" not in s.data["command"]
    }
    # memory 2, fidelity 2 (Fig. 5, Fig. 4), the two long-output runs, and one equal-bits figure per model
    assert len(drawn) == 2 + 2 + 2 + len(models) and {"long-output-1.png", "long-output-2.png"} <= set(section.figures)
    return drawn


def _series(fig):
    """(label, colour) of every labelled line and bar series of a figure."""
    out = []
    for ax in fig.axes:
        handles, labels = ax.get_legend_handles_labels()
        for h, label in zip(handles, labels, strict=True):
            c = h.patches[0].get_facecolor() if isinstance(h, BarContainer) else h.get_color()
            out.append((label, mcolors.to_hex(c)))
    return out


def _method(label: str) -> str | None:
    base = label.split(" (")[0].split(", ")[0]
    base = figures.ALIASES.get(base, base)
    return base if base in figures.COLORS else None


def test_every_method_has_a_fixed_colour_of_its_own():
    assert set(NAMES) | set(TOKEN_METHODS) <= set(figures.COLORS)
    assert len(set(figures.COLORS.values())) == len(figures.COLORS)
    assert not set(figures.FALLBACK) & set(figures.COLORS.values())
    assert figures.color("PN-Mix") == figures.COLORS["PN-Mix"]
    assert figures.color("FP16 (SDPA)") == figures.color("FP16") == figures.COLORS["FP16"]
    assert figures.color("PN-Mix, run 2 (measured)") == figures.COLORS["PN-Mix"]
    assert figures.color("KIVI") == figures.COLORS["KIVI-2 +32 sinks"]  # benchmarks.fidelity.equal_bits' name for it
    assert figures.color("Qwen3-14B") in figures.FALLBACK


def test_an_unknown_name_gets_the_same_colour_in_every_run():
    names = ["Qwen3-14B", "SmolLM2-135M", "prefill", "full", "my-new-cache"]
    code = f"from reports import figures; print([figures.color(n) for n in {names!r}])"
    env = {seed: {**os.environ, "PYTHONHASHSEED": seed} for seed in ("1", "2")}
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=e).stdout
        for e in env.values()
    }
    assert runs == {f"{[figures.color(n) for n in names]}\n"}


def test_a_method_has_the_same_colour_in_every_figure(every_figure):
    seen: dict[str, set[str]] = {}
    figures_of: dict[str, set[int]] = {}
    for i, fig in enumerate(every_figure):
        for label, colour in _series(fig):
            method = _method(label)
            if method is not None:
                seen.setdefault(method, set()).add(colour)
                figures_of.setdefault(method, set()).add(i)
    assert {m: c for m, c in seen.items() if c != {figures.COLORS[m]}} == {}
    # the check means something: the methods compared appear in figures of several sections
    assert {m for m, f in figures_of.items() if len(f) >= 3} >= {"FP16", "Kitty", "PN-Mix", "KIVI-2 +32 sinks"}


def test_legend_labels_are_unique_within_each_figure(every_figure):
    for fig in every_figure:
        legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
        labels = [t.get_text() for legend in legends for t in legend.get_texts()]
        assert labels and len(labels) == len(set(labels)), labels


def test_a_label_given_to_two_series_is_refused():
    def twice(ax):
        ax.plot([0, 1], [0, 1], label="PN-Mix")
        ax.plot([0, 1], [1, 0], label="PN-Mix")

    with pytest.raises(ValueError, match="unique within a panel"):
        figures.png(twice)

    def differently(a, b):
        a.plot([0, 1], [0, 1], color="r", label="PN-Mix")
        b.plot([0, 1], [0, 1], color="b", label="PN-Mix")

    with pytest.raises(ValueError, match="names two differently drawn series"):
        figures.png(differently, ncols=2)


def _covered_points(fig) -> list:
    """Data points (display coordinates) under a legend of the figure, each legend padded by a marker."""
    fig.canvas.draw()
    boxes = [x.get_window_extent().padded(6) for x in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if x]
    covered = []
    for ax in fig.axes:
        for line in ax.get_lines():
            for x, y in ax.transData.transform(line.get_xydata()):
                covered += [(line.get_label(), x, y) for box in boxes if box.contains(x, y)]
    return covered


def test_the_fig5_legend_covers_no_point(drawn):
    full = inputs.load(COMMITTED_FIDELITY, "committed")
    fidelity.render([full])
    fig5 = next(f for f in drawn if f.axes[0].get_title().startswith("Fig. 5"))
    assert len(fig5.axes[0].get_lines()) == 1 + len(paper.FIG5_SHARE_PERCENT)
    assert _covered_points(fig5) == []


def test_two_files_of_one_fidelity_run_are_two_curves_each_named_by_its_file(drawn, tmp_path):
    copy = tmp_path / "copy.json"
    copy.write_bytes(COMMITTED_FIDELITY.read_bytes())
    fidelity.render([inputs.load(COMMITTED_FIDELITY, "committed"), inputs.load(copy, "--input")])
    fig5 = next(f for f in drawn if f.axes[0].get_title().startswith("Fig. 5"))
    measured = [label for label, _ in _series(fig5) if label.endswith("(measured)")]
    assert len(measured) == 2 and len(set(measured)) == 2 and any("copy.json" in x for x in measured)


def test_no_legend_covers_a_point(every_figure):
    covered = {i: _covered_points(fig) for i, fig in enumerate(every_figure)}
    assert {i: points for i, points in covered.items() if points} == {}


def test_the_papers_points_are_labelled_as_the_papers_gpu(drawn):
    memory.render([])
    for fig in drawn:
        labels = [label for label, _ in _series(fig)]
        paper_labels = [x for x in labels if "paper" in x]
        assert sorted(paper_labels) == [f"FP16 (paper, {paper.GPU})", f"PN-Mix (paper, {paper.GPU})"]
        assert all(x.endswith("(model)") for x in labels if "paper" not in x and "budget" not in x)


def test_each_long_output_run_has_a_figure_of_its_own(every_figure):
    runs = [f for f in every_figure if f.axes[0].get_title().startswith("KL(FP16 || method), nats")]
    assert [len(f.axes[0].get_lines()[0].get_xdata()) for f in runs] == [4, 4]
    assert [max(f.axes[0].get_lines()[0].get_xdata()) for f in runs] == [14.0, 28.0]  # each its own positions


def _unlegended(fig) -> list[str]:
    """Labels of series drawn in a figure that no legend of it names."""
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    named = {t.get_text() for legend in legends for t in legend.get_texts()}
    return sorted({label for label, _ in _series(fig)} - named)


def test_every_series_of_every_figure_has_a_legend_entry(every_figure):
    assert [_unlegended(fig) for fig in every_figure] == [[]] * len(every_figure)


def test_the_long_output_tools_figure_names_fp16_and_colours_each_method_once(tmp_path, monkeypatch):
    """`benchmarks.fidelity.long_output` draws FP16 in its NLL panel only: its legend must still name it."""
    from matplotlib.figure import Figure

    from benchmarks.fidelity import long_output as bench_long

    saved, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (saved.append(fig), save(fig, *a, **k))[1])
    data = _long_output(tmp_path, "a.json", 16, "2026-12-01T00:00:00+00:00").data
    bench_long.figure(data, tmp_path / "long.png")
    (fig,) = saved
    assert "FP16" in {label for label, _ in _series(fig)} and _unlegended(fig) == []
    colours = {}
    for label, colour in _series(fig):
        colours.setdefault(label, set()).add(colour)
    assert all(len(c) == 1 for c in colours.values()) and len({c.pop() for c in colours.values()}) == len(colours)


def test_log_axes_print_plain_tick_labels():
    """Math text is off in the report's figures, so a log axis must not label its ticks with it."""
    from reports import figures

    def draw(ax):
        ax.plot([1024, 4096, 32768], [1, 2, 3])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")

    with figures.drawn(draw) as fig:
        fig.canvas.draw()
        x = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
        y = [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()]
    assert x and not [t for t in x + y if "$" in t or "mathdefault" in t], (x, y)
    assert {"1K", "4K", "32K"} <= set(x)
    assert (
        figures.plain_tick(32768) == "32K" and figures.plain_tick(0.5) == "0.5" and figures.plain_tick(1000) == "1000"
    )


def test_fig5_says_on_the_plot_when_its_curve_is_a_smoke_run(drawn, tmp_path):
    import json

    full = inputs.load(COMMITTED_FIDELITY, "committed")
    data = json.loads(COMMITTED_FIDELITY.read_text())
    data.update(command=data["command"] + " --smoke", prompts=1)
    smoke = inputs.load(synthetic.write(tmp_path, "smoke.json", data), "--input")
    fidelity.render([full])
    fidelity.render([smoke])
    full_fig, smoke_fig = (f for f in drawn if f.axes[0].get_title().startswith("Fig. 5"))
    full_text = " ".join(t.get_text() for t in full_fig.findobj(lambda a: hasattr(a, "get_text")))
    smoke_title = smoke_fig.axes[0].get_title()
    assert "smoke" not in full_fig.axes[0].get_title() and "harness check" not in full_text
    assert "smoke run (1 prompt, a harness check, not the claim)" in smoke_title
