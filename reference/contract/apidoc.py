"""The plug-in author's reference page, docs/plugin-api.md, generated from the contract's own code and docstrings so
that it says what the code does: `python -m reference.contract.apidoc > docs/plugin-api.md` (a test holds the
committed page equal to this module's output)."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

import torch

from reference import adapter, contract
from reference.channels.config import PNMixConfig
from reference.channels.layout import CacheLayout
from reference.channels.storage import StorageReport
from reference.contract.implementation import ReferenceImplementation
from reference.equations.quant import Quantized

COMMAND = "python -m reference.contract.apidoc > docs/plugin-api.md"


def _doc(obj: object) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def _line(obj: object) -> str:
    """A docstring on one line (a list item's text), after ': '; nothing without one."""
    text = " ".join(_doc(obj).split())
    return f": {text}" if text else ""


def _summary(obj: object) -> str:
    """A name's first sentence (a constant: its type and where it is defined in full)."""
    if isinstance(obj, dict):
        return "keys " + ", ".join(f"`{key}`" for key in obj)
    if not callable(obj):
        return f"`{obj!r}`"
    first = " ".join(_doc(obj).split("\n\n")[0].split())
    return re.split(r"\.\s+(?=[A-Z`])", first)[0].rstrip(".") + "." if first else "(no docstring)"


def _default(value: object) -> str:
    if isinstance(value, (set, frozenset)):  # sorted: the same page whatever the set's order
        return "{" + ", ".join(map(repr, sorted(value))) + "}"
    return repr(value)


def _block(text: str) -> list[str]:
    """A docstring as an indented text block (its own line breaks and lists kept as written)."""
    return ["```text", text, "```", ""] if text else []


def _signature(name: str, fn: object) -> str:
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.name != "self"]
    return f"{name}{sig.replace(parameters=params)}".replace("'", "")


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _fields(cls: type) -> list[str]:
    """A dataclass's or NamedTuple's fields as a markdown table: name, type, default."""
    hints = typing.get_type_hints(cls) if not dataclasses.is_dataclass(cls) else {}
    rows = []
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = _default(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = _default(f.default_factory())
            else:
                default = "required"
            rows.append((f.name, f.type if isinstance(f.type, str) else getattr(f.type, "__name__", f.type), default))
    else:
        defaults = getattr(cls, "_field_defaults", {})
        for name in cls._fields:
            kind = getattr(hints.get(name), "__name__", hints.get(name))
            rows.append((name, kind, _default(defaults[name]) if name in defaults else "required"))
    out = ["| field | type | default |", "|---|---|---|"]
    out += [f"| `{n}` | `{_cell(t)}` | `{_cell(d)}` |" for n, t, d in rows]
    return [*out, ""]


def _members(protocol: type) -> list[str]:
    """A protocol's members: each method's signature and docstring, each attribute's annotation."""
    out = []
    for name, value in protocol.__dict__.items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            out += [f"- `{name}` (property){_line(value.fget)}"]
        elif callable(value):
            out += [f"- `{_signature(name, value)}`{_line(value)}"]
    for name, hint in inspect.get_annotations(protocol).items():
        out += [f"- `{name}: {hint}` (attribute)"]
    return [*out, ""]


def _components() -> list[str]:
    """The stored components of the default configuration's cache (one layer, d = 128), as `CacheLayout` plans
    them: the names `storage()` reports bytes under."""
    layout = CacheLayout(PNMixConfig(), batch=1, kv_heads=1, head_dim=128, dtype=torch.float16)
    out = ["| component | region | rows per page | columns | dtype | counts as |", "|---|---|---|---|---|---|"]
    out += [
        f"| `{c.name}` | {c.region} | {c.rows_per_page} | {c.columns} | {str(c.dtype).removeprefix('torch.')} | "
        f"{c.counts_as} |"
        for c in layout.components
    ]
    return [*out, ""]


def _table(mapping: dict) -> list[str]:
    return ["| name | meaning |", "|---|---|", *(f"| `{k}` | {_cell(v)} |" for k, v in mapping.items()), ""]


def render() -> str:
    """The page, markdown."""
    impl = ReferenceImplementation
    lines = [
        "# The plug-in API",
        "",
        f"Generated from the code by `{COMMAND}`;",
        "do not edit (a test compares it with the code). How to plug in, step by step: the README's \"Plug in",
        'your implementation"; how the suite judges: docs/conformance.md.',
        "",
        "## What an adapter imports: `reference.adapter`",
        "",
        *_block(_doc(adapter)),
        "Its names:",
        "",
        *(f"- `{name}`: {_summary(getattr(adapter, name))}" for name in adapter.__all__),
        "",
        "## The protocol: `reference.contract`",
        "",
        *_block(_doc(contract)),
        f"Implementations register under the entry-point group `{contract.ENTRY_POINT_GROUP}` (name = factory), or",
        "are named by import path (`--impl package.module:factory`).",
        "",
        "## The implementation object",
        "",
        "What the factory returns has these names (`reference.contract.REQUIRED`); a name it lacks fails the",
        'tests that use it with "X is not defined in Y". The signatures and shapes below are the reference',
        "implementation's (`reference.contract.implementation.ReferenceImplementation`).",
        "",
    ]
    for name in contract.REQUIRED:
        member = getattr(impl, name, None)
        if name == "capabilities":
            lines.append("- `capabilities`: a `Capabilities` (below)")
        elif callable(member):
            lines.append(f"- `{_signature(name, member)}`{_line(member)}")
        else:
            lines.append(f"- `{name}`: {type(member).__name__}")
    lines += ["", "## `Capabilities`: what an implementation claims", "", *_block(_doc(contract.Capabilities))]
    lines += _fields(contract.Capabilities)
    lines += ["Residual policies (`residual`):", "", *_table(contract.RESIDUAL_POLICIES)]
    lines += ["Whose attention `attend` computes (`attention`):", "", *_table(contract.ATTENTION)]
    lines += ["## `Cache`: what `create(config)` returns", "", *_block(_doc(contract.Cache)), *_members(contract.Cache)]
    lines += ["## `TokenCache`: per-token precision", "", *_block(_doc(contract.TokenCache))]
    lines += _members(contract.TokenCache)
    lines += ["## `PNMixConfig`: the configuration a cache is created with", "", *_block(_doc(PNMixConfig))]
    lines += _fields(PNMixConfig)
    lines += ["## Storage components", "", *_block(_doc(StorageReport))]
    lines += [
        "`storage()` returns a `StorageReport` with one field per component (bytes):",
        "",
        *_fields(StorageReport),
    ]
    lines += ["The components of the default configuration, one layer, d = 128, float16:", "", *_components()]
    lines += ["## `Quantized`: what `key_codes()` and `value_codes()` return", "", *_block(_doc(Quantized))]
    lines += _fields(Quantized)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
