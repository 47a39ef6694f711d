"""Evidence about PN-Mix, one folder per kind: `efficiency/` (the Fig. 6/7 harness, workloads, memory
model, plug-ins) timed by `suites/`; `fidelity/` (attention and next-token fidelity on real models);
`accuracy/` (task accuracy through lm-evaluation-harness over `tasks/`); `models/` (which real model a
tool loads, and how its prompts are formatted); `commands/` (what every command shares: checks before
the first expensive step, the result writer, the GPU session).

The commands moved into those folders keep the names users type: `python -m benchmarks.gpu_check`
runs `benchmarks.commands.gpu_check`, and so on for every name in `MOVED`.
"""

import importlib.abc
import importlib.util
import sys

#: Command modules by the name they had before the folders, and the module that now holds each.
MOVED = {
    "benchmarks.equal_bits": "benchmarks.fidelity.equal_bits",
    "benchmarks.gpu_check": "benchmarks.commands.gpu_check",
    "benchmarks.lm_eval_cli": "benchmarks.accuracy.lm_eval_cli",
    "benchmarks.long_output": "benchmarks.fidelity.long_output",
    "benchmarks.memory": "benchmarks.efficiency.memory",
    "benchmarks.role_calibration": "benchmarks.fidelity.role_calibration",
    "benchmarks.task_accuracy": "benchmarks.accuracy.task_accuracy",
}


class _MovedCommands(importlib.abc.MetaPathFinder):
    """Finds a moved command under its old name (for `python -m`), as the module that holds it now."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        spec = importlib.util.find_spec(MOVED[fullname])
        return importlib.util.spec_from_file_location(fullname, spec.origin)


if not any(isinstance(finder, _MovedCommands) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedCommands())
