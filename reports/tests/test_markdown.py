"""Tables always carry a source line; embedded markdown gets one under each of its tables."""

import pytest

from reports.markdown import Claim, demote, sources_under_tables, table

from .mdtables import tables, tables_without_source


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
