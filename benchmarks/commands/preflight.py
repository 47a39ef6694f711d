"""Checks a command runs before its first expensive step: that its results can be written where
`--out` says, that its model file is loadable the way the command will use it, and that its
arguments are in range.

A refusal is the parser's error, as argparse refuses a bad argument: one line naming the argument,
the path, what is wrong and the fix; exit status 2. Nothing here loads weights: a GGUF's header and
tensor index are read (`gguf_header`: under a second for a 262K-token vocabulary), so a file cut
short by a download or damaged on disk is refused before minutes of loading, not after; a folder's
JSON files are parsed, its tokenizer files looked for and its safetensors files' headers read against
their lengths (a save or download stopped part-way). A chat template is looked for where the command
needs one, unless an option replaces it (`benchmarks.models.chat_format`).
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NoReturn

from benchmarks.models.chat_format import MODEL_TEMPLATE, ChatFormat
from benchmarks.models.source import ModelSource, json_object, resolve
from reference.cli import non_negative_int  # noqa: F401 (the commands' argparse type)
from reference.tokens.roles import CHATML

#: What a command asks of a model's chat template: none, one to render prompts with, or one whose
#: markers `reference.tokens.roles` reads to tag each token's role (ChatML's).
CHAT, ROLES = "chat", "roles"
TEMPLATE_KEY = "tokenizer.chat_template"
FETCH_AGAIN = "download it again (or reinstall the package that ships it)"


# -- arguments ------------------------------------------------------------------------------------


def refuse(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """End the command before any work: one line on stderr, exit 2 (the arguments parsed, so no usage)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def for_command(parser, model: str) -> ModelSource:
    """`resolve(model)` for a command line: a model it cannot resolve ends the command with the parser's
    error (one line, exit 2), before any work."""
    try:
        return resolve(model)
    except ValueError as error:
        refuse(parser, str(error))


# -- where the results go -------------------------------------------------------------------------


def output_problem(path: Path) -> str | None:
    """What keeps `path` from being a folder this process can write results into, with the fix; None
    when nothing does (the folder then exists: it is created if missing)."""
    if path.is_symlink() and not path.exists():
        return f"a symbolic link to {os.readlink(path)}, which does not exist; create that folder or choose another"
    if path.exists() and not path.is_dir():
        return "a file, not a folder; choose a folder"
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                return f"{parent} is a file or a broken link, not a folder; choose another place"
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()  # a write, not os.access: root passes that on a read-only disk
    except OSError as err:
        return f"cannot write there ({err.strerror or err}); choose a folder you can write"
    return None


def output_folder(parser: argparse.ArgumentParser, path: str | os.PathLike, flag: str = "--out") -> Path:
    """`path` as a folder the results can be written into (created if missing), else the parser's error."""
    path = Path(path).expanduser()
    problem = output_problem(path)
    if problem is not None:
        refuse(parser, f"{flag} {path}: {problem}")
    return path


# -- a GGUF's header ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict[str, object]  # strings and numbers by key; arrays as None (not needed, not kept)
    tensors: int
    data_end: int  # where the last tensor's data ends, from the start of the file
    last_tensor: str | None  # the tensor whose data ends there
    size: int  # of the file


class _Short(ValueError):
    """The file ends before what is being read."""


#: struct codes of GGUF's scalar value types; 8 is a string, 9 an array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _Reader:
    """Bounds-checked reads from the front of a GGUF file."""

    def __init__(self, buf, size: int) -> None:
        self.buf, self.size, self.pos, self.order = buf, size, 0, "<"

    def take(self, n: int, what: str) -> int:
        if n > self.size - self.pos:
            raise _Short(f"{what}, at byte {self.pos:,}")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, code: str, what: str):
        fmt = struct.Struct(self.order + code)
        return fmt.unpack_from(self.buf, self.take(fmt.size, what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        start = self.take(n, what)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError:
            where = f"bytes {start:,} to {start + n:,}"
            raise ValueError(f"its header is damaged: {what} is not UTF-8 text ({where})") from None

    def value(self, kind: int, what: str):
        if kind == _STRING:
            return self.string(what)
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], what)
        if kind != _ARRAY:
            raise ValueError(f"its header is damaged: {what} has unknown value type {kind}")
        item, n = self.scalar("I", what), self.scalar("Q", what)
        if item in _SCALARS:
            self.take(n * struct.calcsize(_SCALARS[item]), what)
        elif item in (_STRING, _ARRAY):
            if n * 8 > self.size - self.pos:  # each element holds at least a length: refuse a bogus count now
                raise _Short(f"{what} ({n:,} elements), at byte {self.pos:,}")
            for _ in range(n):
                self.value(item, what)
        else:
            raise ValueError(f"its header is damaged: {what} is an array of unknown value type {item}")
        return None


def _parse(buf, size: int) -> GGUFHeader:
    from gguf.constants import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT

    if bytes(buf[: min(size, 4)]) != b"GGUF"[: min(size, 4)]:
        raise ValueError(f"not a GGUF file (it begins {bytes(buf[:4])!r}, not b'GGUF'); {FETCH_AGAIN}")
    r = _Reader(buf, size)
    r.take(4, "the magic")
    version = r.scalar("I", "the version")
    if version & 0xFFFF == 0:  # written for the other byte order
        r.order, version = ">", struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}, where the gguf reader takes versions 2 and 3; {FETCH_AGAIN}")
    tensors, entries = r.scalar("Q", "the tensor count"), r.scalar("Q", "the metadata count")
    metadata: dict[str, object] = {}
    for i in range(entries):
        key = r.string(f"the key of metadata entry {i}")
        metadata[key] = r.value(r.scalar("I", f"metadata {key!r}"), f"metadata {key!r}")
    alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
    if not (isinstance(alignment, int) and alignment > 0 and alignment & (alignment - 1) == 0):
        raise ValueError(f"its header is damaged: general.alignment is {alignment!r}, not a power of two")
    end, last = 0, None
    for i in range(tensors):
        name = r.string(f"the name of tensor {i}")
        what = f"tensor {name!r}"
        dims = [r.scalar("Q", what) for _ in range(r.scalar("I", what))]
        kind, offset = r.scalar("I", what), r.scalar("Q", what)
        if kind not in GGML_QUANT_SIZES or len(dims) > 8:
            raise ValueError(f"its header is damaged: {what} has {len(dims)} dimensions of type {kind}")
        block, block_bytes = GGML_QUANT_SIZES[kind]
        if math.prod(dims) % block:
            raise ValueError(
                f"its header is damaged: {what} of {math.prod(dims):,} elements is no whole number of blocks of {block}"
            )
        if offset + math.prod(dims) // block * block_bytes > end:
            end, last = offset + math.prod(dims) // block * block_bytes, name
    data_start = -(-r.pos // alignment) * alignment
    return GGUFHeader(version, metadata, tensors, data_start + end, last, size)


@lru_cache(maxsize=8)
def _header(path: str, size: int, mtime_ns: int) -> GGUFHeader:
    if size == 0:
        raise ValueError(f"the file is empty; {FETCH_AGAIN}")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return _parse(buf, size)
        except _Short as short:
            raise ValueError(
                f"the file ends inside its header (reading {short} of {size:,}): it is truncated or "
                f"damaged; {FETCH_AGAIN}"
            ) from None


def gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """The header and tensor index of a GGUF file, read without its weights (cached while the file is
    unchanged); ValueError saying what is wrong with the file and how to fix it."""
    try:
        stat = os.stat(path)
        return _header(os.fspath(path), stat.st_size, stat.st_mtime_ns)
    except OSError as err:
        raise ValueError(f"cannot read it ({err.strerror or err})") from None
    except ImportError:
        raise ValueError("reading a GGUF needs the gguf package: pip install gguf") from None


# -- the model ------------------------------------------------------------------------------------


def _template_of(source: ModelSource) -> tuple[Path, str | None]:
    """(the file a model's chat template would be in, the template's text or None)."""
    if source.gguf_file is not None:
        path = source.folder / source.gguf_file
        template = gguf_header(path).metadata.get(TEMPLATE_KEY)
        return path, template if isinstance(template, str) and template else None
    jinja = source.folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja, jinja.read_text(encoding="utf-8", errors="replace")
    config = next(
        (
            source.folder / name
            for name in ("chat_template.json", "tokenizer_config.json")
            if (source.folder / name).is_file()
        ),
        source.folder / "tokenizer_config.json",
    )
    template = json_object(config).get("chat_template") if config.is_file() else None
    if isinstance(template, list):  # named templates: the default one
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return config, template if isinstance(template, str) and template else None


def has_chat_template(source: ModelSource) -> bool:
    """Whether the model ships a chat template (a GGUF's metadata, a folder's tokenizer files)."""
    return _template_of(source)[1] is not None


def model_problem(source: ModelSource) -> str | None:
    """What keeps transformers from loading `source` ("FILE: what is wrong; the fix"), read from its header
    or config, not its weights; None when nothing does."""
    if source.gguf_file is not None:
        path = source.folder / source.gguf_file
        try:
            header = gguf_header(path)
        except ValueError as err:
            return f"{path}: {err}"
        if header.tensors == 0:
            return f"{path}: holds no tensors; {FETCH_AGAIN}"
        if header.data_end > header.size:
            return (
                f"{path}: the file is {header.size:,} bytes, but the data of tensor {header.last_tensor!r} ends "
                f"at byte {header.data_end:,}: it is truncated; {FETCH_AGAIN}"
            )
        if not isinstance(header.metadata.get("general.architecture"), str):
            return f"{path}: its metadata names no general.architecture, which transformers needs; {FETCH_AGAIN}"
        return None
    config = source.folder / "config.json"
    try:
        if not json_object(config).get("model_type"):
            return (
                f'{config}: no "model_type", which transformers needs to tell the architecture; add it (as '
                "in the model's original config.json)"
            )
    except ValueError as err:
        return str(err)
    return tokenizer_problem(source.folder) or weights_problem(source.folder)


#: The files a transformers tokenizer is read from (fast, SentencePiece, BPE and WordPiece vocabularies).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "merges.txt")
TOKENIZER_FETCH = "copy the model's tokenizer files into it (its tokenizer's save_pretrained writes them)"


def tokenizer_problem(folder: Path) -> str | None:
    """A transformers folder without any tokenizer vocabulary: transformers would load the weights first and
    then fail to find one."""
    if any((folder / name).is_file() for name in TOKENIZER_FILES) or any(folder.glob("*.model")):
        return None
    return f"{folder}: no tokenizer files ({', '.join(TOKENIZER_FILES)}); {TOKENIZER_FETCH}"


def weights_problem(folder: Path) -> str | None:
    """A safetensors file of the folder that ends before its header or its last tensor's data (a download
    or a save stopped part-way), read from its header alone; a shard the index names that is missing."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json_object(index).get("weight_map", {}).values()))
        except (ValueError, AttributeError) as err:
            return str(err)
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            return f"{index}: names {missing[0]}, which is not in the folder ({len(missing)} missing); {FETCH_AGAIN}"
    for path in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(path)
        if problem is not None:
            return f"{path}: {problem}; {FETCH_AGAIN}"
    return None


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file's header or length (8 bytes of header length, a JSON header,
    then every tensor's data at the offsets the header gives), None when it is whole."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"the file is {size:,} bytes, shorter than a safetensors header: it is truncated"
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                return f"its header is {n:,} bytes, past the file's {size:,}: it is truncated or damaged"
            header = json.loads(f.read(n))
    except OSError as err:
        return f"cannot read it ({err.strerror or err})"
    except (ValueError, RecursionError):
        return "its header is not valid JSON: it is damaged"
    if not isinstance(header, dict):
        return "its header is not a JSON object: it is damaged"
    ends = [
        (entry["data_offsets"][1], name)
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and len(entry.get("data_offsets") or ()) == 2
    ]
    end, last = max(ends, default=(0, None))
    if 8 + n + end > size:
        return (
            f"the file is {size:,} bytes, but the data of tensor {last!r} ends at byte {8 + n + end:,}: it is truncated"
        )
    return None


def chat_problem(source: ModelSource, need: str | None, given: ChatFormat, name: str) -> str | None:
    """What keeps the command's prompts from being formatted (`need`: CHAT or ROLES, None: no template
    needed), naming the argument (--model `name` or --chat-template) and the option that fixes it; None
    when nothing does."""
    if need is None or given.plain:
        return None
    if given.template is not None:
        flag, template = f"--chat-template {given.file}", given.template
    else:
        try:
            where, template = _template_of(source)
        except ValueError as err:
            return f"--model {name}: {err}"
        flag = f"--model {name}: " + ("the file" if Path(name).expanduser() == where else str(where))
    if template is None:
        key = TEMPLATE_KEY if source.gguf_file else "chat_template"
        plain = " or --plain-prompts" if need == CHAT else ""
        return f"{flag} has no chat template (no {key}); give one with --chat-template FILE{plain}"
    if need == ROLES and CHATML.start not in template:
        return (
            f"{flag}: its chat template has no {CHATML.start} marker, which the role tags read "
            "(reference.tokens.roles.ChatMarkers); give a ChatML template with --chat-template FILE"
        )
    return None


def model(
    parser: argparse.ArgumentParser, name: str, need: str | None = None, given: ChatFormat = MODEL_TEMPLATE
) -> ModelSource:
    """The model `--model` names (`model_source.resolve`), checked as the command will load it (module
    doc); a problem is the parser's error naming the file."""
    source = for_command(parser, name)
    problem = model_problem(source)
    if problem is not None:
        refuse(parser, f"--model {name}: {problem.removeprefix(f'{name}: ')}")  # the file itself: named once
    problem = chat_problem(source, need, given, name)
    if problem is not None:
        refuse(parser, problem)
    return source


def chat_format(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ChatFormat:
    """The chat format `chat_format.add_options`'s options ask for, the template file read and compiled
    (as transformers compiles it) now; a problem is the parser's error naming the file."""
    if getattr(args, "plain_prompts", False):
        return ChatFormat(plain=True)
    path = getattr(args, "chat_template", None)
    if path is None:
        return ChatFormat()
    try:
        template = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        refuse(parser, f"--chat-template {path}: cannot read it as text ({getattr(err, 'strerror', None) or err})")
    if not template.strip():
        refuse(parser, f"--chat-template {path}: the file is empty; give a Jinja chat template")
    from jinja2 import TemplateError
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        _compile_jinja_template(template)
    except TemplateError as err:
        refuse(parser, f"--chat-template {path}: not a Jinja template (line {getattr(err, 'lineno', '?')}: {err})")
    return ChatFormat(template, Path(path))
