"""The plug-in author's API page (docs/plugin-api.md) is the contract's code and docstrings, as generated now."""

import dataclasses
from pathlib import Path

from reference import contract
from reference.channels.config import PNMixConfig
from reference.channels.storage import StorageReport
from reference.contract import apidoc

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugin-api.md"


def test_the_committed_page_is_what_the_code_generates():
    assert PAGE.read_text(encoding="utf-8") == apidoc.render(), f"regenerate it: {apidoc.COMMAND}"


def test_the_page_names_every_required_name_claim_configuration_field_and_storage_component():
    page = apidoc.render()
    names = [
        *contract.REQUIRED,
        *(f.name for f in dataclasses.fields(contract.Capabilities)),
        *(f.name for f in dataclasses.fields(PNMixConfig)),
        *(f.name for f in dataclasses.fields(StorageReport)),
    ]
    assert [n for n in names if f"`{n}" not in page] == []
    for name in ("pack_keys", "unpack_keys", "pack_values", "unpack_values", "pack_mask", "unpack_mask"):
        line = next(x for x in page.splitlines() if x.startswith(f"- `{name}("))
        assert "->" in line, line  # its shapes, from the reference implementation's docstring
