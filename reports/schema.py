"""What the report reads of each kind of result file, dispatched on the file's kind to the module that
writes it: each kind is stated once, as a `reference.schema.Kind` (schema, markdown, canaries, the checks
of its own outcomes) in its writer's module. A malformed file stops the run before any step, not after it.
"""

from __future__ import annotations

from benchmarks.accuracy import task_accuracy
from benchmarks.commands import gpu_check
from benchmarks.efficiency import extra_info
from benchmarks.fidelity import analyses, equal_bits, long_output, role_calibration
from conformance import plugin as conformance
from reference import schema

#: Every kind of result the report reads, by name.
KINDS = {
    k.name: k
    for k in (
        conformance.KIND,
        analyses.KIND,
        long_output.KIND,
        role_calibration.KIND,
        equal_bits.KIND,
        task_accuracy.KIND,
        gpu_check.KIND,
        extra_info.KIND,
    )
}
#: The measured code paths of every kind that records canaries, by name (`reports.currency`).
PIPELINES = {name: canary for k in KINDS.values() for name, canary in k.pipeline.items()}

capped = schema.capped


def problems(kind: str, data: object) -> list[str]:
    """Why the report cannot read `data` as a result of `kind`, one line per problem (none: it can)."""
    return schema.problems(KINDS[kind], data)


def disagreements(kind: str, data: dict) -> list[str]:
    """Where a result of `kind` says what its own outcomes do not give (`reference.schema.disagreements`)."""
    return schema.disagreements(KINDS[kind], data)


def extra_info_problems(info: dict, suite: str, path: str = "extra_info") -> list[str]:
    """Why the report cannot use a benchmark of `suite` with this extra_info (none: it can)."""
    return extra_info.problems(info, suite, path)
