"""The language in which each kind of result file says what it holds: the keys, types and ranges its readers
use, checked when a file is loaded so that a malformed file stops a run before any step, not after it. Each
kind's module (its writer's) states its own `Kind`: the schema, its markdown, its canaries, what the file must
agree with itself on and what its own outcomes must give again; `reports.schema` only dispatches on the name.

A schema is written with plain values:
- a type or a tuple of types: the value is one of them (true/false is never a number);
- `Range(low, high, integer, above)`: a finite number (never NaN or infinite) within the bounds;
  `Figure(range)`: a measured figure, null only at a point that did not run;
- `OneOf(values)`: one of these values;
- a dict: an object with these keys; "key?" marks a key that may be absent, "*" is the schema of
  every other key (without "*" other keys are allowed and not looked at);
- `ListOf(schema, nonempty)`: a list of such items; `Maybe(schema)`: null or such a value.

A schema lists only what its readers use, so files written before a field existed still load where the
readers take it with a default. The upper bounds of the ranges below are far past any real run: a value beyond
one is a damaged or hand-edited file, not a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping

NONE = type(None)
TEXT = (str, NONE)


@dataclasses.dataclass(frozen=True)
class ListOf:
    item: object
    nonempty: bool = False


@dataclasses.dataclass(frozen=True)
class Maybe:
    schema: object


@dataclasses.dataclass(frozen=True)
class Figure(Maybe):
    """A measured figure of a benchmark point: null only where the point did not run (`null_figures`)."""


@dataclasses.dataclass(frozen=True)
class Range:
    """A finite number from `low` to `high` (None: no bound); `above`: greater than `low`, not equal;
    `integer`: a whole number written as one."""

    low: float | None = None
    high: float | None = None
    integer: bool = False
    above: bool = False

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.above and value == self.low)):
            return False
        return self.high is None or value <= self.high

    def __str__(self) -> str:
        what = "an integer" if self.integer else "a finite number"
        if self.low is not None and self.high is not None:
            return f"{what} in {'(' if self.above else '['}{_bound(self.low)}, {_bound(self.high)}]"
        if self.low is not None:
            return f"{what} {'>' if self.above else '>='} {_bound(self.low)}"
        return what if self.high is None else f"{what} <= {_bound(self.high)}"


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e18 else f"{x:g}"


@dataclasses.dataclass(frozen=True)
class OneOf:
    values: tuple

    def __str__(self) -> str:
        return "one of " + ", ".join(map(repr, self.values))


# -- the ranges ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Kind:
    """A kind of result file, stated once by the module that writes it: `name` (the file's `kind`), `schema`
    (what its readers read); `render(result)`: its markdown, the tool's own file and the report's view of it;
    `pipeline`: {name: canary} of the code paths a result of it records (a measurement's; none for a timing);
    `consistent(data)`: (path, problem) of what the file's parts must agree on past each value's shape;
    `recomputed(data)`: a line for each place where the file says what its own outcomes, recomputed by the code
    that made it, do not give."""

    name: str
    schema: dict
    render: Callable[[dict], str] | None = None
    pipeline: Mapping[str, Callable[[], dict]] = dataclasses.field(default_factory=dict)
    consistent: Callable[[dict], list[tuple[str, str]]] | None = None
    recomputed: Callable[[dict], list[str]] | None = None


# -- the ranges ---------------------------------------------------------------------------------

MAX_BATCH = 2**20
MAX_TOKENS = 2**24  # prompt, generated, context and position counts
MAX_SECONDS = 7 * 24 * 3600.0
MAX_GIB = 2.0**20  # a pebibyte
MAX_GBPS = 1e6
MAX_BITS = 32  # per element: FP16 is 16

NONNEGATIVE = Range(0)
FRACTION = Range(0, 1)
#: KL divergence: >= 0, less a rounding margin (two nearly equal distributions give a few ulps below 0).
DIVERGENCE = Range(-1e-6)
COUNT = Range(0, MAX_TOKENS, integer=True)
POSITIVE_COUNT = Range(1, MAX_TOKENS, integer=True)
BATCH = Range(1, MAX_BATCH, integer=True)
SECONDS = Range(0, MAX_SECONDS)  # a duration; 0 for a skipped test
ELAPSED_S = Range(0, MAX_SECONDS, above=True)  # a timed run
MILLISECONDS = Range(0, MAX_SECONDS * 1e3, above=True)
GIB = Range(0, MAX_GIB)
GBPS = Range(0, MAX_GBPS, above=True)
BYTES = Range(1, 2**50, integer=True)
BITS = Range(0, MAX_BITS, above=True)
BIT_WIDTH = Range(0, MAX_BITS, integer=True)
#: Bandwidth against the device's copy: 1.0 is the roofline; caches can take a small working set past it.
COPY_FRACTION = Range(0, 1000, above=True)
LAUNCH_PARAMETER = Range(1, 2**16, integer=True)  # tile, warps, stages, splits
EXIT_CODE = Range(-255, 255, integer=True)  # negative: ended by that signal
LAYER = Range(0, 2**16, integer=True)
EXAMPLES = Range(0, 2**31, integer=True)
#: What every measurement tool's result says of where it ran (`reference.records.record`): the model, the
#: device, the date, the command (its "--smoke" tells a smoke run) and the model file's fingerprint.
MEASUREMENT = {"model": str, "device": str, "date_utc": str, "command": str, "model_fingerprint?": TEXT}
#: A configuration as data (`reference.records.config_record`): its family, then its fields.
CONFIG_RECORD = {"family": OneOf(("PNMixConfig", "TokenPrecisionConfig")), "*": (int, float, str, bool, type(None))}


# -- checking -----------------------------------------------------------------------------------

_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
    dict: "an object",
    list: "a list",
    NONE: "null",
}


def _expected(types: tuple) -> str:
    number = {int, float} <= set(types)
    names = ["a number" if t in (int, float) and number else _NAMES.get(t, t.__name__) for t in types]
    return " or ".join(dict.fromkeys(names))


def _found(value: object) -> str:
    text = repr(value)
    return f"{_NAMES.get(type(value), type(value).__name__)} ({text if len(text) <= 40 else text[:37] + '...'})"


def key(path: str, name: str) -> str:
    """The JSON path of `name` under `path` (a name that is not an identifier in brackets)."""
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        return f"{path}[{name!r}]"
    return f"{path}.{name}" if path else name


def check(schema: object, value: object, path: str) -> list[tuple[str, str]]:
    """(path, problem) of every place where `value` departs from `schema`."""
    if isinstance(schema, Maybe):
        if value is None:
            return []
        found = check(schema.schema, value, path)
        return [(p, f"{problem} or null") if p == path else (p, problem) for p, problem in found]
    if isinstance(schema, (Range, OneOf)):
        ok = schema.holds(value) if isinstance(schema, Range) else any(value == v for v in schema.values)
        return [] if ok else [(path, f"is {_found(value)}, expected {schema}")]
    if isinstance(schema, type):
        schema = (schema,)
    if isinstance(schema, tuple):
        ok = isinstance(value, schema) and not (isinstance(value, bool) and bool not in schema)
        return [] if ok else [(path, f"is {_found(value)}, expected {_expected(schema)}")]
    if isinstance(schema, ListOf):
        if not isinstance(value, list):
            return [(path, f"is {_found(value)}, expected a list")]
        if schema.nonempty and not value:
            return [(path, "is an empty list, expected at least one item")]
        return _items(schema.item, value, path)
    if not isinstance(value, dict):
        return [(path, f"is {_found(value)}, expected an object")]
    out = []
    named = {k.removesuffix("?") for k in schema if k != "*"}
    for k, sub in schema.items():
        if k == "*":
            continue
        name = k.removesuffix("?")
        if name in value:
            out += check(sub, value[name], key(path, name))
        elif not k.endswith("?"):
            out.append((key(path, name), "missing"))
    if "*" in schema:
        out += [p for k, v in value.items() if k not in named for p in check(schema["*"], v, key(path, str(k)))]
    return out


def _items(schema: object, items: list, path: str) -> list[tuple[str, str]]:
    """The problems of a list's items, each said once with the first item that has it and a count
    (a file of 2000 results missing one key gives one line, not 2000)."""
    seen: dict[tuple[str, str], list] = {}
    for i, item in enumerate(items):
        for p, problem in check(schema, item, f"{path}[{i}]"):
            generic = p.replace(f"{path}[{i}]", f"{path}[*]", 1)
            # the same problem with another value is the same problem: counted, said with the first value
            kind = re.sub(r"^is .*?, expected", "is ..., expected", problem)
            seen.setdefault((generic, kind), [p, problem, 0])[2] += 1
    return [
        (first, problem + (f" (and in {n - 1} more items)" if n > 1 else "")) for first, problem, n in seen.values()
    ]


def bad_text(data: object) -> tuple[str, str] | None:
    """The first string (key or value) of `data` that is not valid Unicode (a lone surrogate, which JSON's
    \\ud800 escapes can write and no file or page can hold), as (path, repr); None when there is none. The
    file is encoded once (the common case: all of it is valid) before any string is looked at."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        return None
    except (UnicodeEncodeError, RecursionError):
        pass
    stack = [("", data)]
    while stack:  # not recursive: the parser accepts deeper nesting than a recursive walk could follow
        path, value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if isinstance(k, str) and not _encodable(k):
                return path or "the file", f"has a key that is not valid Unicode ({k!r})"
            where = key(path, k) if isinstance(k, str) else f"{path}[{k}]"
            if isinstance(v, (dict, list)):
                stack.append((where, v))
            elif isinstance(v, str) and not _encodable(v):
                return where, f"is a string that is not valid Unicode ({_found(v)})"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


#: Problems said per file at most: past that the file is plainly of another shape.
MAX_PROBLEMS = 20


def problems(kind: Kind, data: object) -> list[str]:
    """Why `data` cannot be read as a result of `kind`, one line per problem (none: it can)."""
    found = check(kind.schema, data, "")
    if not found and kind.consistent is not None:  # the shapes are right: the parts can be compared
        found = kind.consistent(data)
    bad = bad_text(data)
    found += [bad] if bad else []
    return capped([f"{path or 'the file'}: {problem}" for path, problem in found])


def capped(lines: list[str]) -> list[str]:
    """At most MAX_PROBLEMS lines, the last saying how many more there are."""
    if len(lines) <= MAX_PROBLEMS:
        return lines
    return [*lines[: MAX_PROBLEMS - 1], f"and {len(lines) - MAX_PROBLEMS + 1} more problems"]


# -- recomputing ---------------------------------------------------------------------------------

#: What a recomputation may raise on outcomes of the right shape but the wrong content (a prompt without a
#: method, a series shorter than the others): the file is refused, saying so.
UNCOMPUTABLE = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError)


def why(err: Exception) -> str:
    """An error in one line of at most 120 characters of its text, for a refusal."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:120]}{'...' if len(text) > 120 else ''}"


def disagreements(kind: Kind, data: dict) -> list[str]:
    """Where a result of `kind` (of the right shape: `problems`) says what its own outcomes do not give,
    recomputed by the functions that made it; one line each (none: it says what they give)."""
    return kind.recomputed(data) if kind.recomputed is not None else []
