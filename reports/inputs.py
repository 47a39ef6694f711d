"""Result files the report reads, and what kind each one is (decided from its content by
`reference.records.kind_of`, not from its name).

Kinds: "conformance" (`pytest conformance --conformance-json`), "fidelity" (`python -m
benchmarks.fidelity.analyses`), "gpu-check" (`python -m benchmarks.gpu_check`) and "pytest-benchmark"
(`pytest benchmarks/suites --benchmark-json`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from benchmarks.efficiency import extra_info
from reference import records
from reference.records import BENCHMARK, KINDS
from reports import schema
from reports.provenance import display_path

#: extra_info keys every benchmark of the suites the report reads must have, and each suite's (types:
#: `benchmarks.efficiency.extra_info`).
COMMON_KEYS = tuple(extra_info.EXTRA_INFO_COMMON)
SUITE_KEYS = {suite: tuple(k for k in keys if not k.endswith("?")) for suite, keys in extra_info.EXTRA_INFO.items()}
SCALES = ("full", "tiny")
#: Suites whose figures are computed, not measured: the report shows them from their module instead.
COMPUTED_SUITES = {"fig6-model": "the memory feasibility model (benchmarks.efficiency.memory), in the memory section"}


@dataclasses.dataclass(frozen=True)
class Source:
    """One result file: its kind, content, and how it came to the report."""

    kind: str
    path: Path
    data: dict
    origin: str  # "this run", "committed" or "--input"
    command: str | None = None  # the command that wrote it, when the file does not record it
    shown_as: str | None = None  # its path once the report is published, for files this run wrote
    refused: str = ""  # why no comparison may use it (`load`); empty when one may

    @functools.cached_property
    def name(self) -> str:  # cached: every table row citing the file asks for it
        return self.shown_as or display_path(self.path)


class InputError(ValueError):
    """Result files the report cannot read: one line per problem, each naming its file."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def kind_of(data: object, path: str | os.PathLike) -> str:
    """The kind of a parsed result file; InputError naming the file when it is none of KINDS."""
    try:
        return records.kind_of(data)
    except ValueError as err:
        raise InputError([f"{path}: {err}"]) from None


def _suite_of(bench: dict) -> str | None:
    """The suite of a benchmark the report reads (its extra_info has every key the suite needs and a
    known scale); None for one it leaves out (`benchmark_problems` says why)."""
    info = bench.get("extra_info") or {}
    suite = info.get("suite")
    if suite not in SUITE_KEYS or any(k not in info for k in (*COMMON_KEYS, *SUITE_KEYS[suite])):
        return None
    return suite if info["scale"] in SCALES else None


def benchmark_problems(data: dict) -> list[str]:
    """Why some benchmarks of a pytest-benchmark file are left out (the rest are used): another suite,
    or one written before a key existed. A benchmark the report reads with a value out of its range
    is no reason to leave it out but to refuse the file (`benchmark_value_problems`)."""
    problems = []
    for bench in data["benchmarks"]:
        info = bench.get("extra_info") or {}
        suite = info.get("suite")
        if suite in COMPUTED_SUITES:
            continue
        if suite not in SUITE_KEYS:
            problems.append(f"{bench.get('name')}: extra_info['suite'] is {suite!r}, not one of {sorted(SUITE_KEYS)}")
            continue
        missing = [k for k in (*COMMON_KEYS, *SUITE_KEYS[suite]) if k not in info]
        if missing:
            problems.append(f"{bench.get('name')}: extra_info lacks {', '.join(missing)}")
        elif info["scale"] not in SCALES:
            problems.append(f"{bench.get('name')}: extra_info['scale'] is {info['scale']!r}, not one of {SCALES}")
    return problems


def benchmark_value_problems(data: dict) -> list[str]:
    """The values out of type or range in the benchmarks the report reads, each with its JSON path."""
    return [
        p
        for i, bench in enumerate(data["benchmarks"])
        if (suite := _suite_of(bench)) is not None
        for p in schema.extra_info_problems(bench["extra_info"], suite, f"benchmarks[{i}].extra_info")
    ]


def _cause(err: BaseException) -> str:
    """An error on one line: a parser's message can be long (the digits of an integer past Python's limit)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}{'...' if len(text) > 200 else ''}"


#: The largest result file read (64 MiB, 27 times the largest committed one): parsing takes about 3.3 bytes of
#: memory per byte of JSON, and the checks and sections more; a larger file is refused unread.
MAX_BYTES = 64 * 2**20
#: The longest text (a key or a value) of a result kept as read: a longer one is cut to this many characters
#: when the file is read, marked with the count cut and a digest of the whole (two texts that differ past
#: the cut stay two). The longest text of a committed result has 741.
MAX_TEXT = 1000


def _too_large(path: Path, size: int) -> InputError:
    return InputError(
        [f"{path}: {size:,} bytes, over the {MAX_BYTES:,} bytes (64 MiB) a result file may have; not read"]
    )


def parse(path: Path) -> object:
    """The JSON content of `path`; InputError, one line naming the file, for any file that is not JSON
    (unreadable, not UTF-8, malformed, nested past the parser's depth, an integer past Python's digits) or
    that is larger than MAX_BYTES (refused before it is read; at most MAX_BYTES + 1 bytes are ever read)."""
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise _too_large(path, size)
            raw = f.read(MAX_BYTES + 1)  # the file may have grown since
        if len(raw) > MAX_BYTES:
            raise _too_large(path, len(raw))
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError([f"{path}: cannot read it as JSON (not UTF-8 text: {_cause(err)})"]) from None
    except OSError as err:
        raise InputError([f"{path}: cannot read it ({err.strerror or _cause(err)})"]) from None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError, as are int's digit limits
        raise InputError([f"{path}: cannot read it as JSON ({_cause(err)})"]) from None


def cut(text: str) -> str:
    """`text`, or its first MAX_TEXT characters and how many more there were, with a digest of the whole."""
    if len(text) <= MAX_TEXT:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return f"{text[:MAX_TEXT]}... [{len(text) - MAX_TEXT:,} more characters cut, sha256 {digest}]"


def cut_texts(data: object) -> object:
    """`data` with every text (keys too) cut to MAX_TEXT characters (`cut`); the same object when none is
    longer. Not recursive: the parser takes deeper nesting than a recursive walk could follow."""
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if any(len(k) > MAX_TEXT for k in value):  # rebuilt in its order: the sections show keys in it
                pairs = [(cut(k), v) for k, v in value.items()]
                value.clear()
                value.update(pairs)
            items = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            continue
        for k, v in items:
            if isinstance(v, str) and len(v) > MAX_TEXT:
                value[k] = cut(v)
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return cut(data) if isinstance(data, str) else data


def load(path: str | os.PathLike, origin: str, command: str | None = None, shown_as: str | None = None) -> Source:
    """One result file, parsed and checked against the schema of its kind (InputError otherwise), its texts
    cut to MAX_TEXT (`cut_texts`). One whose aggregates or verdicts are not what its own outcomes give
    (`schema.disagreements`) is read, and refused: `Source.refused` says why, and no comparison uses it."""
    path = Path(path)
    data = parse(path)
    kind = kind_of(data, path)
    problems = schema.problems(kind, data)
    if kind == BENCHMARK and not problems:
        problems = schema.capped(benchmark_value_problems(data))
    if problems:
        raise InputError([f"{path} ({kind}): {p}" for p in problems])
    data = cut_texts(data)
    wrong = schema.disagreements(kind, data)
    refused = ""
    if wrong:
        more = f" (and {len(wrong) - 1} more such values)" if len(wrong) > 1 else ""
        refused = f"refused: its numbers are not what its own outcomes give: {wrong[0]}{more}"
    return Source(kind, path, data, origin, command, shown_as, refused)


def expand(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files as given, and every *.json under each folder (recursively, sorted); missing paths fail."""
    out, missing = [], []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.rglob("*.json") if x.is_file())
        elif p.is_file():
            out.append(p)
        else:
            missing.append(f"--input {p}: no such file or folder")
    if missing:
        raise InputError(missing)
    return out


def load_all(paths: Iterable[str | os.PathLike], origin: str) -> list[Source]:
    """Every result file of `paths`, plus the files a gpu_check record names (its benchmark and
    conformance results) when they lie next to it and were not given already. Every file is read
    before failing, so that the error lists the problems of all of them (`summarized`)."""
    sources, refused = [], []

    def add(path: Path) -> None:
        try:
            sources.append(load(path, origin))
        except InputError as err:
            refused.append((path, err.lines))

    for p in expand(paths):
        add(p)
    seen = {s.path.resolve() for s in sources}
    for check in of_kind(sources, "gpu-check"):
        for name in companions(check.data):
            mate = check.path.parent / name
            if mate.is_file() and mate.resolve() not in seen:
                seen.add(mate.resolve())
                add(mate)
    if refused:
        raise InputError(summarized(refused))
    return sources


#: Files refused for one problem said in full, and refused files said in all; past them, a count.
SHOWN_ALIKE, SHOWN_FILES = 3, 20
#: What differs between two files refused for the same problem: the values and positions it quotes.
_PARTICULARS = re.compile(r"'[^']*'|\d+")


def summarized(refused: list[tuple[Path, list[str]]]) -> list[str]:
    """The lines of the refused files (each names its file): the first SHOWN_ALIKE files refused for one
    problem, then "and N more like it"; at most SHOWN_FILES files in all, then how many more there are."""
    alike: dict[tuple[str, ...], list[list[str]]] = {}
    for path, lines in refused:
        problem = tuple(_PARTICULARS.sub("_", line.replace(str(path), "", 1)) for line in lines)
        alike.setdefault(problem, []).append(lines)
    out, shown, counted = [], 0, 0
    for group in alike.values():
        if shown == SHOWN_FILES:
            break
        these = group[: min(SHOWN_ALIKE, SHOWN_FILES - shown)]
        out += [line for lines in these for line in lines]
        if len(group) > len(these):
            out.append(f"and {_files(len(group) - len(these))} refused like it")
        shown, counted = shown + len(these), counted + len(group)
    if len(refused) > counted:
        out.append(f"and {_files(len(refused) - counted)} refused for other problems")
    return out


def _files(n: int) -> str:
    return f"{n:,} more file{'s' if n > 1 else ''}"


def companions(record: dict) -> list[str]:
    """File names of the results a gpu_check record's steps wrote."""
    names = []
    for step in record.get("steps", {}).values():
        names += [Path(step[key]).name for key in ("json",) if step.get(key)]
        names += [Path(a).name for a in step.get("command", "").split() if a.endswith(".json")]
    return list(dict.fromkeys(names))


def of_kind(sources: Iterable[Source], kind: str) -> list[Source]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return [s for s in sources if s.kind == kind]


#: How pytest-benchmark's JSON names the timer of the suites whose statistics are the figure's calls.
STEP_CLOCK = "CLOCK"


def usable(source: Source) -> list[dict]:
    """The benchmarks of a pytest-benchmark source that the report can use, each as its extra_info
    plus `name`, pytest-benchmark's own host-clock statistics over its rounds (`wall_median_s`,
    `wall_min_s`, `wall_max_s`, `rounds`; None where the file has none), `timed` (what those rounds timed:
    "steps" where the suite's own clock timed the figure's calls, `benchmarks.efficiency.harness.CLOCK`, else
    "point", the whole point) and `source`."""
    out = []
    for b in source.data["benchmarks"]:
        if _suite_of(b) is None:
            continue
        stats = b.get("stats") or {}
        wall = {f"wall_{k}_s": stats.get(k) for k in ("median", "min", "max")}
        timed = "steps" if (b.get("options") or {}).get("timer") == STEP_CLOCK else "point"
        out.append(
            {
                **b["extra_info"],
                "name": b["name"],
                **wall,
                "rounds": stats.get("rounds"),
                "timed": timed,
                "source": source,
            }
        )
    return out


def benchmarks(sources: Iterable[Source], suite: str | None = None, scale: str | None = None) -> list[dict]:
    """Usable benchmarks of every pytest-benchmark source, optionally of one suite and scale."""
    if suite is not None and suite not in SUITE_KEYS:
        raise ValueError(f"suite must be one of {sorted(SUITE_KEYS)}, got {suite!r}")
    if scale is not None and scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return [
        b
        for s in of_kind(sources, BENCHMARK)
        for b in usable(s)
        if (suite is None or b["suite"] == suite) and (scale is None or b["scale"] == scale)
    ]
