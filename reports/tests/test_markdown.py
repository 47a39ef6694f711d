"""Tables always carry a source line; embedded markdown gets one under each of its tables."""

import re

import pytest

from reports.markdown import (
    Citations,
    Claim,
    demote,
    details,
    escape,
    escape_html,
    figure,
    sources_under_tables,
    table,
)
from reports.tests.mdtables import tables, tables_without_source


def test_table_has_its_source_and_escapes_pipes():
    md = table([["a|b", 1.5]], ["name", "x"], "computed: f()")
    assert md.rstrip().endswith("Source: computed: f()")
    assert tables(md)[0][1] == [{"name": "a\\|b", "x": "1.5"}]
    with pytest.raises(ValueError, match="source must say"):
        table([[1]], ["x"], "")


def test_sources_are_added_only_where_missing():
    md = "# T\n\n| a |\n|---|\n| 1 |\n\ntext\n\n" + table([[2]], ["b"], "mine")
    assert tables_without_source(md) == [2]
    fixed = sources_under_tables(md, "theirs")
    assert tables_without_source(fixed) == []
    assert fixed.count("Source: theirs") == 1 and fixed.count("Source: mine") == 1


def test_demote_pushes_every_heading_down():
    assert demote("# A\ntext\n## B\n", 2) == "### A\ntext\n#### B\n"


def test_claim_status_is_checked():
    with pytest.raises(ValueError, match="status must be one of"):
        Claim("c", "probably", "-", "", "")


HOSTILE = "a\n| injected | row |\r\n<script>alert(1)</script> & b|c \x1b[31m"


def test_every_cell_header_and_source_is_escaped_so_no_input_adds_rows_or_html():
    md = table([[HOSTILE, 1.5], ["plain", 2]], [HOSTILE, "x"], f"measured, {HOSTILE}")
    ((_, rows),) = tables(md)
    assert len(rows) == 2 and len(md.splitlines()) == 6  # header, rule, two rows, blank, source
    assert not re.search(r"(?<!\\)<", md), "an unescaped < could start HTML"
    assert "\x1b" not in md and not any(line.startswith("| injected") for line in md.splitlines())
    assert rows[0]["x"] == "1.5" and rows[1]["x"] == "2"
    cell = rows[0][next(iter(rows[0]))]
    assert cell == "a \\| injected \\| row \\| \\<script>alert(1)\\</script> & b\\|c  [31m"


def test_escape_is_idempotent_and_leaves_markdown_of_the_sections_alone():
    once = escape(HOSTILE)
    assert escape(once) == once and "\n" not in once and not re.search(r"(?<!\\)<", once)
    assert escape("**confirmed**, `pytest -k a` [F1]") == "**confirmed**, `pytest -k a` [F1]"
    assert escape("K &amp; V: 3 &lt; 4 & 5 > 2") == "K &amp; V: 3 &lt; 4 & 5 > 2"


def test_escape_follows_markdown_rules_not_html_entities():
    # Our own prose and commands read as written in the markdown source: no character references.
    assert escape("PN-Mix -> KIVI: <q_i, k_i>") == "PN-Mix -> KIVI: \\<q_i, k_i>"
    assert escape("`pytest -k 'a<b' > out.txt` then <b>") == "`pytest -k 'a<b' > out.txt` then \\<b>"
    assert escape("> not a quote") == "\\> not a quote"
    assert escape_html("<b> & &amp;") == "&lt;b&gt; &amp; &amp;"


def test_details_figures_and_legends_escape_their_text():
    assert "<script>" not in details(HOSTILE, "body") and details("a", "b").startswith("<details><summary>a</summary>")
    fig = figure("f.png", f"caption [x](y) *z* {HOSTILE}")
    unescaped = re.compile(r"(?<!\\)<")
    assert fig.count("\n") == 3 and not unescaped.search(fig) and "](f.png)" in fig and "\\[x\\](y)" in fig
    cite = Citations("R")
    cite.cite(HOSTILE)
    assert not unescaped.search(cite.legend()) and len(cite.legend().splitlines()) == 3
