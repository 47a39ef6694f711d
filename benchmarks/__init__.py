"""Evidence about PN-Mix, one folder per kind: `efficiency/` (the Fig. 6/7 harness, workloads, memory
model, plug-ins) timed by `suites/`; `fidelity/` (attention and next-token fidelity on real models);
`accuracy/` (task accuracy through lm-evaluation-harness over `tasks/`); `models/` (which real model a
tool loads, and how its prompts are formatted); `commands/` (what every command shares: checks before
the first expensive step, the result writer, the GPU session).

Each command is a console script (`pnmix-gpu-check`, `pnmix-fidelity`, `pnmix-long-output`, `pnmix-equal-bits`,
`pnmix-role-calibration`, `pnmix-task-accuracy`, `pnmix-memory`, `pnmix-lm-eval`; `pyproject.toml`). The names
they had before the folders (every name in `MOVED`) still run, for this release, after a one-line notice naming
the script; `python -m` of the module that holds each runs it without one. `python -m benchmarks.gpu_check` stays
without a notice: a GPU machine runs it from a checkout that nothing was installed from (no console script).
"""

import importlib.abc
import importlib.util
import sys

#: Command modules by the name they had before the folders: the module that now holds each, and its script.
MOVED = {
    "benchmarks.equal_bits": ("benchmarks.fidelity.equal_bits", "pnmix-equal-bits"),
    "benchmarks.gpu_check": ("benchmarks.commands.gpu_check", "pnmix-gpu-check"),
    "benchmarks.lm_eval_cli": ("benchmarks.accuracy.lm_eval_cli", "pnmix-lm-eval"),
    "benchmarks.long_output": ("benchmarks.fidelity.long_output", "pnmix-long-output"),
    "benchmarks.memory": ("benchmarks.efficiency.memory", "pnmix-memory"),
    "benchmarks.role_calibration": ("benchmarks.fidelity.role_calibration", "pnmix-role-calibration"),
    "benchmarks.task_accuracy": ("benchmarks.accuracy.task_accuracy", "pnmix-task-accuracy"),
}

#: Old names that stay, without a notice: the GPU check, which a GPU machine may run from a checkout it installed
#: nothing from.
KEPT = frozenset({"benchmarks.gpu_check"})


class _MovedCommands(importlib.abc.MetaPathFinder):
    """Finds a moved command under its old name (for `python -m`), as the module that holds it now, and says
    once, on stderr, which script replaces it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        module, script = MOVED[fullname]
        if fullname not in KEPT:
            print(
                f"note: `python -m {fullname}` is deprecated and goes in the next release; run `{script}` "
                f"(or `python -m {module}`), with the same options",
                file=sys.stderr,
            )
        spec = importlib.util.find_spec(module)
        return importlib.util.spec_from_file_location(fullname, spec.origin)


if not any(isinstance(finder, _MovedCommands) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedCommands())
