"""What the report reads of each kind of result file: the keys and types its sections use, checked
when a file is loaded so that a malformed file stops the run before any step, not after it.

A schema is written with plain values:
- a type or a tuple of types: the value is one of them (true/false is never a number);
- a dict: an object with these keys; "key?" marks a key that may be absent, "*" is the schema of
  every other key (without "*" other keys are allowed and not looked at);
- `ListOf(schema, nonempty)`: a list of such items; `Maybe(schema)`: null or such a value.

Each schema lists only what the code reads (`reports/sections/`, and the `markdown`/`verdicts` of
`benchmarks.fidelity` and `benchmarks.long_output` that the fidelity section calls), so files
written before a field existed still load where the sections read it with a default.
"""

from __future__ import annotations

import dataclasses
import re

from benchmarks.fidelity import ORDER
from reference import paper
from reference.records import BENCHMARK

NUM = (int, float)
NONE = type(None)
TEXT = (str, NONE)
FIGURE = (int, float, NONE)  # a measured figure: null where the point ran out of memory


@dataclasses.dataclass(frozen=True)
class ListOf:
    item: object
    nonempty: bool = False


@dataclasses.dataclass(frozen=True)
class Maybe:
    schema: object


# -- the kinds ----------------------------------------------------------------------------------

CONFORMANCE = {
    "results": ListOf(
        {
            "implementation": str,
            "module": str,
            "property": str,
            "outcome": str,
            "duration_s": NUM,
            "reason?": TEXT,
            "example?": TEXT,  # a failure's example, fitted to the claims and shrunk
            "measured?": Maybe({"*": (int, float, str)}),  # figures (the largest of each is shown) and descriptions
        }
    ),
    "device?": TEXT,
    "date_utc?": TEXT,
    "created_utc?": TEXT,  # results written before reference.records
    "command?": TEXT,
    "machine?": {"TRITON_INTERPRET?": TEXT},
    "implementation_details?": ListOf({"name": str}),
}

_TABLE9 = {"mse": NUM, "kl": NUM}
FIDELITY = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,  # its "--smoke" tells a smoke run
    "prompts": int,
    "prompt_tokens": int,
    "new_tokens": int,
    "versions": dict,
    "model_fingerprint?": TEXT,
    "summary": {
        # benchmarks.fidelity.verdicts reads every criterion of Fig. 4's order at both scopes and both r
        "fig4_jaccard_mean": {
            **{f"{c} ({scope}), r={r}": NUM for c in ORDER for scope in ("prefill", "full") for r in ("10%", "50%")},
            "*": NUM,
        },
        "fig4_aggregated_jaccard_mean?": {"*": NUM},
        "fig4_pairs?": {"per_layer_and_prompt": ListOf(int), "exact": bool, "max_pairs": int},
        "fig5_share_median": {**{str(p): NUM for p in paper.FIG5_TOP_PERCENT}, "*": NUM},
        # the methods benchmarks.fidelity.verdicts names; the others are listed in the table
        "table9_mean": {
            "KIVI-style uniform 2-bit": _TABLE9,
            "PolarQuant-style 2-bit": _TABLE9,
            "H3(50%)L1, qk-pair-norm (prefill)": _TABLE9,
            "*": _TABLE9,
        },
        "table11_overlap_mean": {"*": {"*": NUM}},
    },
    "end_to_end?": {
        "methods": {
            "*": {
                "identical_fraction": ListOf(NUM, nonempty=True),
                "first_divergence": ListOf((int, NONE)),
                "nll": NUM,
                "quantized_reads?": Maybe(ListOf({"tokens": int, "tokens_with_quantized_pages": int})),
            }
        },
        "fp16_nll": NUM,
        "heldout_tokens": int,
        "prefix": int,
        "warnings?": ListOf(str),
    },
}

_CURVE = ListOf(NUM, nonempty=True)  # one mean per span of positions; its quarters are averaged
LONG_OUTPUT = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,
    "prompts": int,
    "chunk": int,
    "key_bits?": {"*": NUM},
    "model_fingerprint?": TEXT,
    "summary": {
        "positions": int,
        "bin_edges": ListOf(int, nonempty=True),
        "methods": {"FP16": {"nll": _CURVE}, "*": {"kl?": _CURVE, "top1?": _CURVE, "nll?": _CURVE}},
    },
}

ROLE_CALIBRATION = {
    "model": {"name": str, "fingerprint": str},
    "command": str,
    "layers": ListOf(int, nonempty=True),
    "group_size": int,
    "calibration": {
        "tags": ListOf(str, nonempty=True),
        "tokens": ListOf(int, nonempty=True),
        "distortion": ListOf(ListOf(NUM, nonempty=True), nonempty=True),
        "requests": int,
    },
    "allocations": ListOf({"budget": NUM, "bits": ListOf(int), "average_bits": NUM, "distortion": NUM, "search": str}),
}

_EQUAL_BITS_METHOD = {"bits": NUM, "config": str, "stored_bits": NUM, "attention_kl": NUM, "output_mse": NUM,
                      "e2e_kl?": NUM, "e2e_top1?": NUM, "e2e_nll": NUM, "low_share?": NUM}  # fmt: skip
EQUAL_BITS = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,  # its "--smoke" tells a smoke run
    "model_fingerprint?": TEXT,
    "layers": ListOf(int, nonempty=True),
    "conversations": {"calibration": ListOf(str), "evaluation": ListOf(str), "evaluation_tokens": ListOf(int)},
    "results": ListOf(
        {
            "budget": NUM,
            "methods": {"*": _EQUAL_BITS_METHOD},
            "long_output": {"*": {"kl?": _CURVE, "top1?": _CURVE, "nll?": _CURVE}},
            "long_positions": int,
            "memory": ListOf(
                {
                    "method": str,
                    "fig6a_longest_generation": (int, NONE),
                    "fig6b_max_batch": int,
                    "cache_gib_at_b32_8k": NUM,
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
    "steps?": {"*": {"command": str, "exit_code": (int, NONE), "seconds": FIGURE, "json?": TEXT}},
}

#: The file as a whole; each benchmark's extra_info is judged by `EXTRA_INFO`, and one outside it is
#: left out with a note (a pytest-benchmark file may hold benchmarks of other suites).
PYTEST_BENCHMARK = {
    "machine_info": {"cpu?": {"brand_raw?": TEXT}},
    "benchmarks": ListOf({"name": str, "extra_info?": Maybe(dict), "stats?": {"median?": FIGURE}}),
}

_TASK_RESULT = {"correct": ListOf((int, bool), nonempty=True)}
TASK_ACCURACY = {
    "model": str,
    "device": str,
    "date_utc": str,
    "command": str,
    "model_fingerprint?": TEXT,
    "tasks": ListOf({"name": str, "items": int, "chance": NUM}, nonempty=True),
    "runs": ListOf(
        {
            "label": str,
            "role": str,
            "key_bits?": (int, float, NONE),
            "value_bits?": (int, float, NONE),
            "budget?": (int, float, NONE),
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
EXTRA_INFO = {
    "fig6-memory": {"batch": NUM, "prompt": NUM, "generation": NUM, "oom": bool,
                    "peak_allocated_gib": FIGURE, "model_peak_gib": FIGURE},
    "fig6c-throughput": {"batch": NUM, "prompt": NUM, "generation": NUM, "protocol": str,
                         "tokens_per_s": FIGURE, "total_s": FIGURE, "oom": bool},
    "fig7-latency": {"batch": NUM, "prompt": NUM, "step": NUM, "step_ms": FIGURE},
    "kernel": {"batch": NUM, "context": NUM, "ms": FIGURE, "bytes": FIGURE, "gbps": FIGURE, "copy_gbps": FIGURE,
               "fraction_of_copy": FIGURE},
    "kernel-launch": {"batch": NUM, "context": NUM, "block_n": NUM, "warps": NUM, "stages": NUM, "split_factor": NUM,
                      "fits": (bool, NONE), "ms": FIGURE, "gbps": FIGURE, "copy_gbps": FIGURE,
                      "fraction_of_copy": FIGURE, "max_error?": FIGURE, "error_bound?": FIGURE, "splits?": NUM},
}  # fmt: skip


# -- checking -----------------------------------------------------------------------------------

_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "an object",
          list: "a list", NONE: "null"}  # fmt: skip


def _expected(types: tuple) -> str:
    names = ["a number" if t in (int, float) and set(NUM) <= set(types) else _NAMES.get(t, t.__name__) for t in types]
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
        return [] if value is None else _check(schema.schema, value, path)
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
            seen.setdefault((generic, problem), [p, 0])[1] += 1
    out = []
    for (_, problem), (first, n) in seen.items():
        out.append((first, problem + (f" (and in {n - 1} more items)" if n > 1 else "")))
    return out


#: Problems said per file at most: past that the file is plainly of another shape.
MAX_PROBLEMS = 20


def problems(kind: str, data: object) -> list[str]:
    """Why the report cannot read `data` as a result of `kind`, one line per problem (none: it can)."""
    found = [f"{path or 'the file'}: {problem}" for path, problem in _check(SCHEMAS[kind], data, "")]
    if len(found) > MAX_PROBLEMS:
        found = [*found[: MAX_PROBLEMS - 1], f"and {len(found) - MAX_PROBLEMS + 1} more problems"]
    return found


def extra_info_problems(info: dict, suite: str) -> list[str]:
    """Why the report cannot use a benchmark of `suite` with this extra_info (none: it can)."""
    schema = {**EXTRA_INFO_COMMON, **EXTRA_INFO[suite]}
    return [f"{path}: {problem}" for path, problem in _check(schema, info, "extra_info")]
