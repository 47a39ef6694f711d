"""Text of result files reaches the page as text: judged by a CommonMark renderer with GitHub's tables
(markdown-it-py), not by a pattern, and cut to `reports.inputs.MAX_TEXT` characters when read."""

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reports import cli, currency, inputs
from reports.markdown import escape, figure, table
from reports.tests import synthetic
from reports.tests.mdtables import tables, tables_without_source
from reports.tests.test_inputs import VALID
from reports.tests.test_report import NOTHING_RUN

markdown_it = pytest.importorskip("markdown_it")
RENDERER = markdown_it.MarkdownIt("commonmark").enable("table")

#: What a hostile name, device or label can carry past a naive escape: an escaped backtick before a tag (the
#: tag then opens no code span), an escaped backslash before one (the `<` is then not escaped), a backtick
#: of its own beside the sections' code spans, links, images, a link definition, pipes.
ATTACKS = (
    "\\`<img src=x onerror=alert(1)>`",
    "\\\\<img src=x onerror=alert(2)>",
    "a` <img src=x onerror=alert(3)> `b",
    "``<img src=x onerror=alert(4)>`",
    "[click](javascript:alert(5)) ![pixel](http://evil.example/p.png) [ref][r]",
    "[r]: http://evil.example/ref",
    "x\\](http://evil.example/y)",
    "a|b \\|c `d|e` \\\\|f",
)
PIECES = st.sampled_from(
    ["`", "``", "\\", "<img src=x onerror=alert(0)>", "<b>", "[", "]", "(", ")", "!", "|", "a", " "]
)


def rendered_html_tags(markdown: str) -> list[str]:
    """The start tags of the HTML that `markdown` renders to, with their attributes."""
    return re.findall(r"<[a-zA-Z][^>]*>", RENDERER.render(markdown))


#: The elements the report itself writes: markdown's blocks, tables, code, emphasis; `details` (HTML).
OWN = {"p", "h1", "h2", "h3", "h4", "ul", "ol", "li", "table", "thead", "tbody", "tr", "th", "td", "code", "pre"}
OWN |= {"strong", "em", "details", "summary", "hr", "blockquote"}


def foreign(markdown: str) -> list[str]:
    """Tags of the rendered page that no input may add: raw HTML, links and images, other than the report's
    own elements, its figures (a local PNG) and its contents (links to its headings)."""
    out = []
    for tag in rendered_html_tags(markdown):
        name, _, attributes = tag[1:-1].partition(" ")
        mine = name in OWN and attributes in ("", 'style="text-align:right"', 'style="text-align:left"')
        figure_ = name == "img" and re.fullmatch(r'src="[\w.-]+\.png" alt="[^"<>]*" /', attributes)
        anchor = name == "a" and re.fullmatch(r'href="#[\w-]*"', attributes)
        if not (mine or figure_ or anchor):
            out.append(tag)
    return out


@pytest.mark.parametrize("attack", ATTACKS)
def test_prose_cells_sources_and_captions_escape_every_attack(attack):
    composed = f"model {attack}, command `{attack}` on {attack}"
    page = "\n\n".join(
        [
            escape(composed),
            table([[composed, 1.5], [attack, 2]], [attack, "x"], f"measured, {composed}"),
            figure("f.png", composed),
        ]
    )
    assert foreign(page) == [], page
    ((_, rows),) = tables(page)
    assert [r["x"] for r in rows] == ["1.5", "2"]  # no cell ended early: each row keeps its columns
    assert "<td>" not in RENDERER.render(escape(composed))


@given(st.lists(PIECES, max_size=30).map("".join))
def test_no_text_adds_html_links_images_or_cells(text):
    composed = f"`{text}` {text} [F1]"
    once = escape(composed)
    assert escape(once) == once
    assert foreign(once) == [] and foreign(table([[composed, 1]], ["h", "x"], "s")) == []
    html = RENDERER.render(table([[composed, 1]], ["h", "x"], "s"))
    assert html.count("<td>") == 2  # the text's cell and the number's


def test_a_long_text_is_cut_when_read_with_its_length_and_digest(tmp_path):
    data = synthetic.task_accuracy()
    data["model"] = "M" * 100_000
    data["runs"][1]["label"] = "L" * 5000 + "a"
    data["runs"][2]["label"] = "L" * 5000 + "b"  # the same first MAX_TEXT characters: still two runs
    source = inputs.load(synthetic.write(tmp_path, "long.json", data), "--input")
    model = source.data["model"]
    assert model.startswith("M" * inputs.MAX_TEXT + "... [99,000 more characters cut, sha256 ")
    assert len(model) < inputs.MAX_TEXT + 60
    assert len({r["label"] for r in source.data["runs"]}) == len(data["runs"])


def current_measurement(data: dict) -> dict:
    """`data` (a measurement) with canaries, judged current by a test that says they reproduce."""
    return {**data, "behaviour": {"canaries": {"pipeline": {"exact": {}, "floats": {}}}, "data": {}}}


def hostile_inputs(tmp_path) -> list[str]:
    """Every kind of result with every attack in every name, device, command and label it shows: current
    (compared in its section) and of other code (under History)."""
    argv = []
    for name, make in VALID.items():
        data = make()
        data.pop("per_prompt", None)  # its keys would have to carry the attack too
        keys = tuple(k for k in synthetic.SHOWN_TEXT if k not in ("claim", "evidence"))  # recomputed from results
        for i, attack in enumerate(ATTACKS):
            spoiled = synthetic.hostile(synthetic.current(data), keys, attack)
            if name in currency.BEHAVIOUR_KINDS:
                spoiled = current_measurement(spoiled)
            old = synthetic.hostile(synthetic.of_other_code(data), synthetic.SHOWN_TEXT, attack)
            argv += ["--input", str(synthetic.write(tmp_path, f"{name}-{i}.json", spoiled))]
            argv += ["--input", str(synthetic.write(tmp_path, f"{name}-{i}-old.json", old))]
    return argv


@pytest.mark.slow
@pytest.mark.filterwarnings("error::UserWarning")  # matplotlib's, for a character no font draws
def test_the_rendered_report_has_no_html_link_or_image_of_its_inputs(tmp_path, monkeypatch):
    monkeypatch.setattr(currency.canaries, "moved", lambda recorded, pipeline=None: [])
    data = synthetic.task_accuracy()
    data["model"] = "M" * 100_000
    argv = [*hostile_inputs(tmp_path), "--input", str(synthetic.write(tmp_path, "long.json", data))]
    out = ["--out-dir", str(tmp_path / "out"), "--name", "r", "--no-committed-results", *NOTHING_RUN]
    assert cli.main([*out, *argv]) == 0
    md = (tmp_path / "out" / "r" / "REPORT.md").read_text()
    sections = md.split("\n## ")
    task_accuracy, history = (next(s for s in sections if s.startswith(n)) for n in ("8. Task", "10. History"))
    assert "onerror=alert(1)" in task_accuracy and "-old.json" in history  # the attacks are shown, as text
    assert foreign(md) == []
    assert "M" * (inputs.MAX_TEXT + 1) not in md and "M" * inputs.MAX_TEXT in md
    assert tables(md) and tables_without_source(md) == []
