"""A plug-in whose import or factory ends the process: the report refuses it in one line naming it, instead
of ending with no output (the check is `conformance.loader.check_in_child`, which pnmix-lm-eval shares)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: Plug-in modules that end the process while they load, and how the refusal says it ended.
EXITING = {
    "exits_in_factory": ("import os\n\n\ndef make():\n    os._exit(0)\n", "ended the process (exit status 0)"),
    "killed_on_import": (
        "import os\nimport signal\n\nos.kill(os.getpid(), signal.SIGKILL)\n\n\ndef make():\n    pass\n",
        "ended the process (killed by SIGKILL)",
    ),
}


@pytest.mark.slow  # a fresh report process and its child, each importing torch: about 10 s on two CPU cores
@pytest.mark.parametrize("module", sorted(EXITING))
def test_the_report_refuses_a_plugin_that_ends_the_process_while_loading(tmp_path, module):
    text, says = EXITING[module]
    (tmp_path / f"{module}.py").write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}
    argv = ["--out-dir", str(tmp_path / "out"), "--name", "r", "--impl", f"{module}:make", "--no-benchmarks"]
    command = [sys.executable, "-m", "reports", *argv, "--fidelity", "off"]
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    said = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert run.returncode == 2 and said, said[-20:]
    assert said[-1].startswith(f"python -m reports: error: --impl '{module}:make': implementation '{module}:make': ")
    assert says in said[-1] and not (tmp_path / "out" / "r").exists()
