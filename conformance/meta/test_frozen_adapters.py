"""The plug-in surface does not move under an adapter: adapters frozen as users copied them (last week's
template, written against the spec's module names before they moved; this week's; the third party built on the
template) import and run against today's spec, the old names with a `DeprecationWarning` naming the new home;
the shipped template imports only from `reference.adapter`."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import reference.adapter
from conformance.impls import template
from conformance.meta.test_mutants import run_suite
from reference import PNMixConfig
from reference.moved import MOVED
from reference.records import code_files

ROOT = Path(__file__).resolve().parents[2]
FROZEN = "conformance.meta.frozen"


def test_the_template_imports_only_from_the_adapter_module():
    tree = ast.parse(Path(template.__file__).read_text())
    ours = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.split(".")[0] in ("reference", "conformance", "pnmix")
    }
    ours |= {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] in ("reference", "conformance", "pnmix")
    }
    assert ours == {"reference.adapter"}


def test_every_name_of_the_adapter_module_is_there():
    missing = [name for name in reference.adapter.__all__ if not hasattr(reference.adapter, name)]
    assert not missing and len(set(reference.adapter.__all__)) == len(reference.adapter.__all__)


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_moved_module_imports_under_its_old_name_as_itself_with_a_warning(old, new, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new}.*reference\.adapter"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)  # one module object: classes keep their identity
    # ... that keeps its own name and spec: tools that find code by module name (fingerprints) still find it
    assert module.__name__ == new and importlib.util.find_spec(new).name == new
    assert code_files(new), f"{new} has no source file after its old name was imported"


def test_last_weeks_template_warns_at_its_own_import_lines():
    code = (
        "import warnings, json\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        f"    import {FROZEN}.template_20261201\n"
        "print(json.dumps([(str(w.message).split(';')[0], w.filename.rsplit('/', 1)[-1], w.category.__name__) "
        "for w in caught if issubclass(w.category, DeprecationWarning)]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    warned = json.loads(run.stdout.splitlines()[-1])
    assert sorted(message for message, _, _ in warned) == [
        "reference.attention moved to reference.equations.attention",
        "reference.layout moved to reference.channels.layout",
        "reference.validation moved to reference.channels.validation",
    ]
    assert {filename for _, filename, _ in warned} == {"template_20261201.py"}  # the user's line, not ours


@pytest.mark.parametrize("name", ["template_20261201", "template_20261207", "thirdparty_20261207"])
def test_a_frozen_adapter_caches_and_attends_as_the_shipped_template(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the old names' warnings: tested above, in a fresh process
        frozen = importlib.import_module(f"{FROZEN}.{name}")
    config = PNMixConfig(b_high=2, b_low=2, ratio=0.0, group_size=16, residual_length=16, n_sink=0)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen) for _ in range(3))
    outputs = []
    for impl in (frozen.make(), template.make()):
        cache = impl.create(impl.capabilities.configured(config))
        cache.prefill(q, k, v)
        cache.append(k[:, :, :3], v[:, :, :3])
        outputs.append(cache.attend(q[:, :, -1:]))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_todays_names_import_without_a_deprecation_warning():
    code = (
        "import warnings\n"
        "warnings.filterwarnings('error', message='.* moved to ', category=DeprecationWarning)\n"
        f"import {FROZEN}.template_20261207, {FROZEN}.thirdparty_20261207, conformance.impls.template\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow  # the whole suite at the ci profile: about as long as the shipped template's run
def test_last_weeks_template_conforms(tmp_path):
    out = tmp_path / "frozen.json"
    result = run_suite("conformance", "--impl", f"{FROZEN}.template_20261201:make", "--conformance-json", str(out))
    assert result.returncode == 0, result.stdout[-4000:]
    outcomes = {r["outcome"] for r in json.loads(out.read_text())["results"]}
    assert outcomes <= {"passed", "skipped", "measured"} and "passed" in outcomes
