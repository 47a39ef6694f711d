"""A task-accuracy result extended by the runs it lacks (`pnmix-task-accuracy --extend RESULT`), so that a run
added to the sweep's plan (a control, the paper's main configuration) is measured on the same items without
running the others again.

The extension is one more piece of the same sweep: it is refused unless the earlier result was made on the same
model file, tasks (their data files byte for byte), documents per task, pair layout, lm-eval version and
computation (dtype and kind of device), by code whose canaries this tree still reproduces. FP16 runs again and
must answer every item as the earlier FP16 did: the check that the new runs pair item by item with the earlier
ones. The merged result holds every earlier run's outcomes as the earlier file holds them, the new runs', and the
earlier file's name, digest, command and seconds (`extends`)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.canaries import behaviour as canaries
from reference import records, schema
from reference.records import file_digest


class ExtensionError(ValueError):
    """The earlier result cannot be extended by this sweep: one line saying why."""


def load(path: Path, kind: schema.Kind) -> dict:
    """The earlier result at `path`, checked against the task-accuracy schema."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExtensionError(f"{path}: cannot be read as a result ({err})") from None
    found = data.get(records.KIND) if isinstance(data, dict) else None
    if found != records.TAGS[kind.name]:
        raise ExtensionError(f"{path}: not a {kind.name} result (kind {found!r})")
    if problems := schema.problems(kind, data):
        raise ExtensionError(f"{path}: {problems[0]}")
    return data


def computation(data: dict) -> dict:
    """The dtype and kind of device the result was computed in; a result of code that recorded neither ran in the
    default of its code, float32 on the CPU, unless its device is no CPU or a run names a dtype."""
    if "dtype" in data and "device_class" in data:
        return {"dtype": data["dtype"], "device": data["device_class"]}
    named = any("dtype=" in r.get("model_args", "") for r in data["runs"])
    if str(data.get("device", "")).startswith("cpu") and not named:
        return {"dtype": "float32", "device": "cpu"}
    raise ExtensionError("the result records no dtype and kind of device, and they cannot be told from it")


def check_same(
    data: dict,
    *,
    fingerprint: str,
    files: dict[str, str],
    limit: int | None,
    layout: str,
    lm_eval: str,
    made_in: dict,
    pipeline: dict,
) -> None:
    """That this sweep computes what made `data`: ExtensionError naming the first difference."""
    differs = [
        ("model file", data.get("model_fingerprint"), fingerprint),
        ("task data", data.get("task_files"), files),
        ("documents per task", data.get("limit"), limit),
        ("pair layout", data.get("pair_layout"), layout),
        ("lm-eval version", data.get("lm_eval_version"), lm_eval),
        ("computation", computation(data), made_in),
    ]
    for what, theirs, ours in differs:
        if theirs != ours:
            raise ExtensionError(f"its {what} is {theirs!r}, this sweep's {ours!r}")
    moved = canaries.moved(data.get("behaviour") or {}, pipeline)
    if moved or not (data.get("behaviour") or {}).get("canaries"):
        why = "; ".join(moved) if moved else "it records no canaries"
        raise ExtensionError(f"made by code that computes otherwise ({why}): remake it whole")


def missing(data: dict, planned: list) -> list:
    """The planned runs (`benchmarks.accuracy.sweep.Run`) the result lacks; a planned run whose label the result
    holds with other model_args is refused (the same label would name two configurations)."""
    held = {r["label"]: r.get("model_args") for r in data["runs"]}
    for run in planned:
        if run.label in held and held[run.label] != run.model_args():
            raise ExtensionError(
                f"its run {run.label!r} ran with model_args {held[run.label]!r}, the plan's with {run.model_args()!r}"
            )
    return [r for r in planned if r.label not in held]


def fp16_differences(data: dict, fp16: dict) -> list[str]:
    """The tasks where this sweep's FP16 run (a run record) answers otherwise than the earlier FP16."""
    earlier = next(r for r in data["runs"] if r["role"] == "baseline")
    return [t for t, result in fp16["results"].items() if earlier["results"][t]["correct"] != result["correct"]]


def merge(data: dict, path: Path, new: dict, planned: list) -> dict:
    """The result `new` (this sweep's record: FP16 and the runs `data` lacks) with the earlier runs of `data` (at
    `path`) before them, in the plan's order; an earlier run whose model_args are the plan's gets the plan's
    description (design, configuration: results of older code recorded model_args alone), its outcomes kept."""
    described = {r.label: r.describe() for r in planned}
    held = {r["label"]: r.get("model_args") for r in data["runs"]}
    same = {label for label, d in described.items() if held.get(label, None) == d["model_args"]}
    earlier = [{**r, **described[r["label"]]} if r["label"] in same else r for r in data["runs"]]
    added = [r for r in new["runs"] if r["role"] != "baseline"]
    order = {label: i for i, label in enumerate(described)}
    runs = sorted([*earlier, *added], key=lambda r: order.get(r["label"], len(order)))
    extends = {
        "file": path.name,
        "digest": file_digest(path),
        "command": data["command"],
        "date_utc": data["date_utc"],
        "seconds": data.get("scoring_seconds", data.get("seconds")),
        "runs": [r["label"] for r in data["runs"]],
    }
    return {**new, "runs": runs, "extends": [*data.get("extends", []), extends]}
