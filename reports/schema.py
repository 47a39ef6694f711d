"""What the report reads of each kind of result file: the keys, types and ranges its sections use,
checked when a file is loaded so that a malformed file stops the run before any step, not after it.

A schema is written with plain values:
- a type or a tuple of types: the value is one of them (true/false is never a number);
- `Range(low, high, integer, above)`: a finite number (never NaN or infinite) within the bounds;
  `Figure(range)`: a measured figure, null only at a point that did not run (`null_figures`);
- `OneOf(values)`: one of these values (an outcome the conformance plug-in writes);
- a dict: an object with these keys; "key?" marks a key that may be absent, "*" is the schema of
  every other key (without "*" other keys are allowed and not looked at);
- `ListOf(schema, nonempty)`: a list of such items; `Maybe(schema)`: null or such a value.

Each schema lists only what the code reads (`reports/sections/`, and the `markdown`/`verdicts` of
`benchmarks.fidelity.analyses` and `benchmarks.fidelity.long_output` that the fidelity section calls), so files
written before a field existed still load where the sections read it with a default. The upper
bounds are far past any real run: a value beyond one is a damaged or hand-edited file, not a measurement.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

from benchmarks.fidelity import equal_bits, role_calibration
from benchmarks.fidelity import long_output as bench_long
from reference import paper
from reference.equations.saliency import CRITERIA
from reference.records import BENCHMARK
from reference.tokens.config import TokenPrecisionConfig

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
#: What a conformance property measured: any number (a failing implementation may measure inf or NaN).
MEASURED = (int, float, str)
#: A configuration as data (`reference.records.config_record`): its family, then its fields.
CONFIG_RECORD = {"family": OneOf(("PNMixConfig", "TokenPrecisionConfig")), "*": (int, float, str, bool, type(None))}
#: The outcomes the conformance plug-in records (`conformance.plugin.pytest_runtest_makereport`).
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed", "measured")


# -- the kinds ----------------------------------------------------------------------------------

CONFORMANCE = {
    "results": ListOf(
        {
            "implementation": str,
            "module": str,
            "property": str,
            "outcome": OneOf(OUTCOMES),
            "duration_s": SECONDS,
            "reason?": TEXT,
            "example?": TEXT,  # a failure's example, fitted to the claims and shrunk
            # figures (the largest of each is shown), descriptions, and the workload's configuration as data
            "measured?": Maybe({"realistic_config?": CONFIG_RECORD, "*": MEASURED}),
            # examples run and dropped (outside the claims); results written before they were counted lack it
            "examples?": {"run": EXAMPLES, "dropped": EXAMPLES},
        }
    ),
    "device?": TEXT,
    "date_utc?": TEXT,
    "created_utc?": TEXT,  # results written before reference.records
    "command?": TEXT,
    "machine?": {"TRITON_INTERPRET?": TEXT},
    "implementation_details?": ListOf({"name": str}),
}

_TABLE9 = {"mse": NONNEGATIVE, "kl": DIVERGENCE}
FIDELITY = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,  # its "--smoke" tells a smoke run
    "prompts": POSITIVE_COUNT,
    "prompt_tokens": POSITIVE_COUNT,
    "new_tokens": COUNT,
    "versions": dict,
    "model_fingerprint?": TEXT,
    "summary": {
        # benchmarks.fidelity.claims.verdicts reads every criterion of Fig. 4's order at both scopes and both r
        "fig4_jaccard_mean": {
            **{
                f"{c} ({scope}), r={r}": FRACTION
                for c in CRITERIA
                for scope in ("prefill", "full")
                for r in ("10%", "50%")
            },
            "*": FRACTION,
        },
        "fig4_aggregated_jaccard_mean?": {"*": FRACTION},
        "fig4_pairs?": {"per_layer_and_prompt": ListOf(COUNT), "exact": bool, "max_pairs": COUNT},
        "fig5_share_median": {**{str(p): FRACTION for p in paper.FIG5_TOP_PERCENT}, "*": FRACTION},
        # the methods benchmarks.fidelity.claims.verdicts names; the others are listed in the table
        "table9_mean": {
            "KIVI-style uniform 2-bit": _TABLE9,
            "PolarQuant-style 2-bit": _TABLE9,
            "H3(50%)L1, qk-pair-norm (prefill)": _TABLE9,
            "*": _TABLE9,
        },
        "table11_overlap_mean": {"*": {"*": FRACTION}},
    },
    "end_to_end?": {
        "methods": {
            "*": {
                "identical_fraction": ListOf(FRACTION, nonempty=True),
                "first_divergence": ListOf(Maybe(COUNT)),
                "nll": NONNEGATIVE,
                "quantized_reads?": Maybe(ListOf({"tokens": COUNT, "tokens_with_quantized_pages": COUNT})),
            }
        },
        "fp16_nll": NONNEGATIVE,
        "heldout_tokens": COUNT,
        "prefix": COUNT,
        "warnings?": ListOf(str),
    },
}


def _curves(kl: object = DIVERGENCE) -> dict:
    """A method's curves over a long output: one mean per span of positions (its quarters are averaged)."""
    return {
        "kl?": ListOf(kl, nonempty=True),
        "top1?": ListOf(FRACTION, nonempty=True),
        "nll?": ListOf(NONNEGATIVE, nonempty=True),
    }


LONG_OUTPUT = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,
    "prompts": POSITIVE_COUNT,
    "chunk": POSITIVE_COUNT,
    "key_bits?": {"*": BITS},
    "model_fingerprint?": TEXT,
    "summary": {
        "positions": POSITIVE_COUNT,
        "bin_edges": ListOf(COUNT, nonempty=True),
        "methods": {"FP16": {"nll": ListOf(NONNEGATIVE, nonempty=True)}, "*": _curves()},
    },
}

ROLE_CALIBRATION = {
    "model": {"name": str, "fingerprint": str},
    "command": str,
    "layers": ListOf(LAYER, nonempty=True),
    "group_size": POSITIVE_COUNT,
    "calibration": {
        "tags": ListOf(str, nonempty=True),
        "tokens": ListOf(COUNT, nonempty=True),
        "distortion": ListOf(ListOf(NONNEGATIVE, nonempty=True), nonempty=True),
        "requests": COUNT,
    },
    "allocations": ListOf(
        {"budget": BITS, "bits": ListOf(BIT_WIDTH), "average_bits": BITS, "distortion": NONNEGATIVE, "search": str}
    ),
}

_EQUAL_BITS_METHOD = {
    "bits": BITS,
    "config": str,
    "stored_bits": BITS,
    "attention_kl": DIVERGENCE,
    "output_mse": NONNEGATIVE,
    "e2e_kl?": DIVERGENCE,
    "e2e_top1?": FRACTION,
    "e2e_nll": NONNEGATIVE,
    "low_share?": FRACTION,
}
#: The methods `benchmarks.fidelity.equal_bits.findings` compares (and divides by the KL of TriAxialKV and PN-Mix).
_COMPARED = {**_EQUAL_BITS_METHOD, "e2e_kl": DIVERGENCE}
_DIVISOR = {**_COMPARED, "attention_kl": Range(0, above=True), "e2e_kl": Range(0, above=True)}
EQUAL_BITS = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,  # its "--smoke" tells a smoke run
    "model_fingerprint?": TEXT,
    "layers": ListOf(LAYER, nonempty=True),
    "conversations": {"calibration": ListOf(str), "evaluation": ListOf(str), "evaluation_tokens": ListOf(COUNT)},
    "results": ListOf(
        {
            "budget": BITS,
            "methods": {
                "TriAxialKV": _DIVISOR,
                "PN-Mix": _DIVISOR,
                "role-aware PN-Mix": _COMPARED,
                "KIVI": _COMPARED,
                "Kitty": _COMPARED,
                "*": _EQUAL_BITS_METHOD,
            },
            "long_output": {"*": _curves()},
            "long_positions": POSITIVE_COUNT,
            "memory": ListOf(
                {
                    "method": str,
                    "fig6a_longest_generation": Maybe(COUNT),
                    "fig6b_max_batch": Range(0, MAX_BATCH, integer=True),
                    "cache_gib_at_b32_8k": GIB,
                }
            ),
        },
        nonempty=True,
    ),
    "claims": ListOf({"claim": str, "holds": bool, "source": str, "evidence": str}),
}

GPU_CHECK = {
    "device?": TEXT,
    "date_utc?": TEXT,
    "command?": TEXT,
    "steps?": {"*": {"command": str, "exit_code": Maybe(EXIT_CODE), "seconds": Maybe(SECONDS), "json?": TEXT}},
}

#: The file as a whole; each benchmark's extra_info is judged by `EXTRA_INFO`, and one outside it is
#: left out with a note (a pytest-benchmark file may hold benchmarks of other suites).
PYTEST_BENCHMARK = {
    "machine_info": {"cpu?": {"brand_raw?": TEXT}},
    "benchmarks": ListOf(
        {
            "name": str,
            "extra_info?": Maybe(dict),
            # host-clock wall times over the rounds (the tiny harness shows their spread)
            "stats?": {**{f"{k}?": Maybe(SECONDS) for k in ("median", "min", "max")}, "rounds?": Maybe(COUNT)},
        }
    ),
}

_TASK_RESULT = {"correct": ListOf(OneOf((0, 1)), nonempty=True)}  # true and false are 1 and 0
TASK_ACCURACY = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,
    "model_fingerprint?": TEXT,
    "tasks": ListOf({"name": str, "items": Range(1, 10**9, integer=True), "chance": FRACTION}, nonempty=True),
    "runs": ListOf(
        {
            "label": str,
            "role": str,
            # what a reader pairs runs by (results of older code record model_args alone)
            "design?": Maybe(TEXT),
            "config?": Maybe(CONFIG_RECORD),
            "options?": {"*": (int, float, str, bool)},
            "key_bits?": Maybe(BITS),
            "value_bits?": Maybe(BITS),
            "budget?": Maybe(BITS),
            "results": {"*": _TASK_RESULT},
        },
        nonempty=True,
    ),
}

SCHEMAS = {
    "conformance": CONFORMANCE,
    "fidelity": FIDELITY,
    "long-output": LONG_OUTPUT,
    "role-calibration": ROLE_CALIBRATION,
    "equal-bits": EQUAL_BITS,
    "task-accuracy": TASK_ACCURACY,
    "gpu-check": GPU_CHECK,
    BENCHMARK: PYTEST_BENCHMARK,
}

#: extra_info of every benchmark of the suites the report reads, and of each suite.
EXTRA_INFO_COMMON = {
    "suite": str,
    "scale": str,
    "device": str,
    "versions": dict,
    "date_utc": str,
    "command": str,
    "model": str,
    "method": str,
    "timing": str,
}
_POINT = {"batch": BATCH, "prompt": COUNT}
EXTRA_INFO = {
    "fig6-memory": {
        **_POINT,
        "generation": POSITIVE_COUNT,
        "oom": bool,
        "peak_allocated_gib": Figure(GIB),
        "model_peak_gib": Figure(GIB),
        "peak_reserved_gib?": Maybe(GIB),
        # the memory cap the point ran under (0: none); the memory section keeps the paper's 40 GiB points
        "budget_gib?": Maybe(GIB),
    },
    "fig6c-throughput": {
        **_POINT,
        "generation": POSITIVE_COUNT,
        "protocol": str,
        "tokens_per_s": Figure(Range(0, 1e9, above=True)),
        "total_s": Figure(ELAPSED_S),
        "oom": bool,
    },
    "fig7-latency": {**_POINT, "step": COUNT, "step_ms": Figure(MILLISECONDS)},
    "kernel": {
        "batch": BATCH,
        "context": POSITIVE_COUNT,
        "ms": Figure(MILLISECONDS),
        "bytes": Figure(BYTES),
        "gbps": Figure(GBPS),
        "copy_gbps": GBPS,
        "fraction_of_copy": Figure(COPY_FRACTION),
        "roofline_ms?": Maybe(MILLISECONDS),
        "oom?": bool,
    },
    # benchmarks/suites/test_eval_speed.py: one task item or one generation through a method's cache, CPU
    "eval-speed": {
        "work": OneOf(("item", "generation")),
        "length": POSITIVE_COUNT,
        "threads": POSITIVE_COUNT,
        "seconds": Figure(ELAPSED_S),
    },
    # benchmarks/suites/test_ptx_unpack.py: the decode kernel with and without the PTX unpack of its value codes
    "kernel-ptx": {
        "batch": BATCH,
        "context": POSITIVE_COUNT,
        "bytes": Figure(BYTES),
        "copy_gbps": GBPS,
        "plain_path": OneOf(("plain", "ptx")),
        "ptx_path": OneOf(("plain", "ptx")),
        "self_test": str,
        "device_on?": (bool, NONE),
        "identical": bool,
        "plain_max_error": Figure(NONNEGATIVE),
        "ptx_max_error": Figure(NONNEGATIVE),
        "error_bound": Figure(NONNEGATIVE),
        "plain_ms": Figure(MILLISECONDS),
        "ptx_ms": Figure(MILLISECONDS),
        "plain_fraction_of_copy?": Figure(COPY_FRACTION),
        "ptx_fraction_of_copy?": Figure(COPY_FRACTION),
    },
    # benchmarks/suites/test_fragment_design.py: the fragment-order loop in the form the package launches
    # (its path "off", and no timing, where its self-test cannot run: no CUDA device)
    "kernel-fragment": {
        "batch": BATCH,
        "context": POSITIVE_COUNT,
        "bytes": Figure(BYTES),
        "copy_gbps": GBPS,
        "path": str,
        "self_test": str,
        "splits?": POSITIVE_COUNT,
        "merge?": OneOf(("in the loop", "merge kernel")),
        "ms?": Figure(MILLISECONDS),
        "gbps?": Figure(GBPS),
        "fraction_of_copy?": Figure(COPY_FRACTION),
    },
    "kernel-launch": {
        "batch": BATCH,
        "context": POSITIVE_COUNT,
        "block_n": LAUNCH_PARAMETER,
        "warps": LAUNCH_PARAMETER,
        "stages": LAUNCH_PARAMETER,
        "split_factor": LAUNCH_PARAMETER,
        "fits": (bool, NONE),
        "ms": Figure(MILLISECONDS),
        "gbps": Figure(GBPS),
        "copy_gbps": Figure(GBPS),
        "fraction_of_copy": Figure(COPY_FRACTION),
        "max_error?": Maybe(NONNEGATIVE),
        "error_bound?": Maybe(Range(0, above=True)),
        "splits?": LAUNCH_PARAMETER,
        "oom?": bool,
    },
}


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


def _key(path: str, key: str) -> str:
    if not re.fullmatch(r"[A-Za-z_]\w*", key):
        return f"{path}[{key!r}]"
    return f"{path}.{key}" if path else key


def _check(schema: object, value: object, path: str) -> list[tuple[str, str]]:
    """(path, problem) of every place where `value` departs from `schema`."""
    if isinstance(schema, Maybe):
        if value is None:
            return []
        found = _check(schema.schema, value, path)
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
            out += _check(sub, value[name], _key(path, name))
        elif not k.endswith("?"):
            out.append((_key(path, name), "missing"))
    if "*" in schema:
        out += [p for k, v in value.items() if k not in named for p in _check(schema["*"], v, _key(path, str(k)))]
    return out


def _items(schema: object, items: list, path: str) -> list[tuple[str, str]]:
    """The problems of a list's items, each said once with the first item that has it and a count
    (a file of 2000 results missing one key gives one line, not 2000)."""
    seen: dict[tuple[str, str], list] = {}
    for i, item in enumerate(items):
        for p, problem in _check(schema, item, f"{path}[{i}]"):
            generic = p.replace(f"{path}[{i}]", f"{path}[*]", 1)
            # the same problem with another value is the same problem: counted, said with the first value
            kind = re.sub(r"^is .*?, expected", "is ..., expected", problem)
            seen.setdefault((generic, kind), [p, problem, 0])[2] += 1
    return [
        (first, problem + (f" (and in {n - 1} more items)" if n > 1 else "")) for first, problem, n in seen.values()
    ]


def _bad_text(data: object) -> tuple[str, str] | None:
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
            where = _key(path, k) if isinstance(k, str) else f"{path}[{k}]"
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


def problems(kind: str, data: object) -> list[str]:
    """Why the report cannot read `data` as a result of `kind`, one line per problem (none: it can)."""
    found = _check(SCHEMAS[kind], data, "")
    if not found and kind in CONSISTENT:  # the shapes are right: the parts can be compared
        found = CONSISTENT[kind](data)
    bad = _bad_text(data)
    found += [bad] if bad else []
    return capped([f"{path or 'the file'}: {problem}" for path, problem in found])


def capped(lines: list[str]) -> list[str]:
    """At most MAX_PROBLEMS lines, the last saying how many more there are."""
    if len(lines) <= MAX_PROBLEMS:
        return lines
    return [*lines[: MAX_PROBLEMS - 1], f"and {len(lines) - MAX_PROBLEMS + 1} more problems"]


def _long_output(data: dict) -> list[tuple[str, str]]:
    """Each curve has one mean per span of positions (the figure plots it against the spans' middles)."""
    spans = len(data["summary"]["bin_edges"]) - 1
    return [
        (
            _key(_key("summary.methods", name), metric),
            f"has {len(curve)} values, expected one per span of bin_edges ({spans})",
        )
        for name, curves in data["summary"]["methods"].items()
        for metric, curve in curves.items()
        if metric in ("kl", "top1", "nll") and len(curve) != spans
    ]


def _task_accuracy(data: dict) -> list[tuple[str, str]]:
    """One FP16 baseline run, and every run with an outcome for each item of every task (runs are paired
    item by item)."""
    out = [] if any(r["role"] == "baseline" for r in data["runs"]) else [("runs", "has no run of role 'baseline'")]
    for i, run in enumerate(data["runs"]):
        for t in data["tasks"]:
            path = _key(f"runs[{i}].results", t["name"])
            if t["name"] not in run["results"]:
                out.append((path, "missing: every run has a result for every task of `tasks`"))
            elif len(run["results"][t["name"]]["correct"]) != t["items"]:
                out.append(
                    (
                        f"{path}.correct",
                        f"has {len(run['results'][t['name']]['correct'])} outcomes, "
                        f"expected the task's {t['items']} items",
                    )
                )
    return out


def _equal_bits(data: dict) -> list[tuple[str, str]]:
    """The memory of FP16 and TriAxialKV at every budget (the concurrency claim divides one by the other)."""
    out = []
    for i, r in enumerate(data["results"]):
        batch = {m["method"]: m["fig6b_max_batch"] for m in r["memory"]}
        if batch.get("FP16", 0) < 1 or "TriAxialKV" not in batch:
            out.append((f"results[{i}].memory", "lacks FP16 (with a largest batch of at least 1) or TriAxialKV"))
    return out


#: What a file of a kind must agree with itself on, past the shape of each value.
CONSISTENT = {"long-output": _long_output, "task-accuracy": _task_accuracy, "equal-bits": _equal_bits}


# -- what a result's own outcomes give ------------------------------------------------------------

#: `benchmarks.fidelity.long_output.rounded` keeps 6 significant digits of each position's value: a mean of
#: them is within half a unit of the 6th digit (5e-6 of its size) of the mean the summary was computed from.
ROUNDED = 5e-6
#: What a recomputation may raise on outcomes of the right shape but the wrong content (a prompt without a
#: method, a series shorter than the others): the file is refused, saying so.
_UNCOMPUTABLE = (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError, AttributeError)


def _why(err: Exception) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:120]}{'...' if len(text) > 120 else ''}"


def _summary_from_series(data: dict) -> list[str]:
    """A long-output summary against `long_output.summarize` of the per-prompt series the file keeps (a file
    without them has nothing to recompute from)."""
    series = data.get("per_prompt")
    if series is None:
        return []
    summary = data["summary"]
    try:
        again = bench_long.summarize(series, len(summary["bin_edges"]) - 1)
    except _UNCOMPUTABLE as err:
        return [f"per_prompt: its series cannot be summarized ({_why(err)})"]
    out = [
        f"summary.{key} is {summary[key]}, its per_prompt series give {again[key]}"
        for key in ("positions", "bin_edges")
        if summary[key] != again[key]
    ]
    given, computed = summary["methods"], again["methods"]
    out += [
        f"summary.methods lacks {name!r}, which its per_prompt series hold" for name in computed if name not in given
    ]
    for name, curves in given.items():
        for metric, curve in curves.items():
            mine = computed.get(name, {}).get(metric)
            where = f"summary.methods[{name!r}].{metric}"
            if mine is None:
                out.append(f"{where} has no per_prompt series to come from")
                continue
            if len(mine) != len(curve):
                out.append(f"{where} has {len(curve)} values, its per_prompt series give {len(mine)}")
                continue
            out += [
                f"{where}[{i}] is {a:.6g}, its per_prompt series give {b:.6g}"
                for i, (a, b) in enumerate(zip(curve, mine, strict=True))
                if not math.isclose(a, b, rel_tol=2 * ROUNDED, abs_tol=1e-12)
            ]
    return out


def _claims_from_results(data: dict) -> list[str]:
    """An equal-bits result's verdicts (`claims`: each claim and whether it holds) against
    `equal_bits.claims` of its own results."""
    try:
        again = {c["claim"]: c["holds"] for c in equal_bits.claims(data["results"])}
    except _UNCOMPUTABLE as err:
        return [f"claims: cannot be recomputed from its results ({_why(err)})"]
    given = {c["claim"]: c["holds"] for c in data["claims"]}
    said = {True: "holds", False: "does not hold"}
    out = [f"claims lacks {c!r} ({said[h]} on its results)" for c, h in again.items() if c not in given]
    for claim, holds in given.items():
        if claim not in again:
            out.append(f"claims has {claim!r}, which its results do not give")
        elif holds != again[claim]:
            out.append(f"claims says {claim!r} {said[holds]}; its results say it {said[again[claim]]}")
    return out


def _allocations_from_calibration(data: dict) -> list[str]:
    """A role calibration's allocations (bits per tag at each budget, their average and total distortion)
    against `role_calibration.allocations` of its own calibration table, at its group size."""
    config = TokenPrecisionConfig(group_size=data["group_size"])
    budgets = [a["budget"] for a in data["allocations"]]
    try:
        again = role_calibration.allocations(data["calibration"], budgets, config)
    except _UNCOMPUTABLE as err:
        return [f"allocations: cannot be recomputed from its calibration ({_why(err)})"]
    out = []
    for i, (given, mine) in enumerate(zip(data["allocations"], again, strict=True)):
        where = f"allocations[{i}] (budget {given['budget']:g})"
        if given["bits"] != mine["bits"]:
            out.append(f"{where}.bits are {given['bits']}, its calibration gives {mine['bits']}")
        for key in ("average_bits", "distortion"):
            if not math.isclose(given[key], mine[key], rel_tol=1e-9, abs_tol=1e-12):
                out.append(f"{where}.{key} is {given[key]:.6g}, its calibration gives {mine[key]:.6g}")
    return out


#: The kinds that keep the outcomes their aggregates and verdicts come from, and the check of each. A
#: task-accuracy result keeps only its per-document outcomes (the report computes every accuracy, interval
#: and verdict from them); a fidelity result keeps no per-prompt values: its summary is evidence as given.
RECOMPUTED = {
    "long-output": _summary_from_series,
    "equal-bits": _claims_from_results,
    "role-calibration": _allocations_from_calibration,
}


def disagreements(kind: str, data: dict) -> list[str]:
    """Where a result of `kind` (of the right shape: `problems`) says what its own outcomes do not give,
    recomputed by the functions that made it; one line each (none: it says what they give)."""
    check = RECOMPUTED.get(kind)
    return check(data) if check else []


def did_not_run(info: dict) -> bool:
    """Whether a benchmark point did not run: out of memory, or a launch choice that does not fit."""
    return info.get("oom") is True or info.get("fits") is False


def null_figures(info: dict, suite: str, path: str = "extra_info") -> list[tuple[str, str]]:
    """The figures that are null at a full-scale point that ran: the sections compute with each of them
    (the tiny harness on a CPU leaves out what it cannot measure there, and its table shows "-")."""
    if info.get("scale") != "full" or did_not_run(info):
        return []
    why = "is null at a full-scale point that ran (neither out of memory nor a launch choice that does not fit)"
    return [
        (_key(path, k), f"{why}: expected a number")
        for k, sub in EXTRA_INFO[suite].items()
        if isinstance(sub, Figure) and k in info and info[k] is None
    ]


def extra_info_problems(info: dict, suite: str, path: str = "extra_info") -> list[str]:
    """Why the report cannot use a benchmark of `suite` with this extra_info (none: it can)."""
    schema = {**EXTRA_INFO_COMMON, **EXTRA_INFO[suite]}
    found = _check(schema, info, path)
    return [f"{p}: {problem}" for p, problem in found or null_figures(info, suite, path)]
