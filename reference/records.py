"""Result records: the environment every result carries, its kind tag, and atomic writes.

Every result this project writes (conformance, fidelity and gpu_check JSON, and each benchmark's
pytest-benchmark `extra_info`) carries the fields of `environment`: the device its tensors ran
on, the date (ISO 8601 UTC, seconds), the command, package versions and the machine. Files we
write ourselves also carry a "kind" tag (`record`); pytest-benchmark files are told by their own
keys (`kind_of`). Files are written atomically and never over an existing file unless asked to.

A measurement tool's result also carries what decides it, under "behaviour" (the canaries of the methods,
implementations and pipeline it ran, its data's digests, the model's fingerprint, the numerics libraries'
versions: `benchmarks.canaries.behaviour.record`, given to `record` as a field); `reports.currency` keeps it
current while those canaries reproduce. The code fingerprint (`loaded_code`) is recorded beside it.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as _dt
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from reference.channels.config import PNMixConfig
from reference.tokens.config import TokenPrecisionConfig

#: Bytes per GiB, the unit of every memory figure recorded (the paper's "GB" are GiB too).
GIB = 2**30

# -- kinds ------------------------------------------------------------------------------------

KIND = "kind"
#: Tag written under KIND, by kind: a reader decides from the content, never from the file name.
TAGS = {
    "conformance": "pnmix-conformance",
    "equal-bits": "pnmix-equal-bits",
    "fidelity": "pnmix-fidelity",
    "gpu-check": "pnmix-gpu-check",
    "long-output": "pnmix-long-output",
    "role-calibration": "pnmix-role-calibration",
    "task-accuracy": "pnmix-task-accuracy",
}
BENCHMARK = "pytest-benchmark"  # `pytest --benchmark-json`: no tag of ours, its keys tell it
KINDS = (*TAGS, BENCHMARK)


def kind_of(data: object) -> str:
    """The kind (one of KINDS) of a parsed result file; ValueError saying what was found otherwise."""
    if isinstance(data, dict):
        by_tag = {tag: kind for kind, tag in TAGS.items()}
        if data.get(KIND) in by_tag:
            return by_tag[data[KIND]]
        if isinstance(data.get("benchmarks"), list) and "machine_info" in data:
            return BENCHMARK
    found = f"kind {data.get(KIND)!r}" if isinstance(data, dict) and KIND in data else f"no {KIND!r} key"
    raise ValueError(
        f"not a result file of this project ({found}); expected JSON with kind "
        f"{', '.join(repr(t) for t in TAGS.values())}, or a pytest-benchmark JSON (keys 'benchmarks' and "
        "'machine_info')"
    )


def record(kind: str, device: torch.device | str | None = None, **fields) -> dict:
    """A result of `kind` (a key of TAGS): its tag, the environment of `device`, the code it measured
    (`loaded_code`, unless `fields` give `code`), then `fields` (a field named like an environment one,
    such as `command`, replaces it)."""
    if kind not in TAGS:
        raise ValueError(f"kind must be one of {sorted(TAGS)}, got {kind!r}")
    code = fields.pop("code", None) or loaded_code()
    return {KIND: TAGS[kind], **environment(device), "code": code, **fields}


# -- a configuration as data -------------------------------------------------------------------

#: The configuration families a record can hold, by the name it records.
CONFIG_FAMILIES = {c.__name__: c for c in (PNMixConfig, TokenPrecisionConfig)}


def config_record(config: PNMixConfig | TokenPrecisionConfig) -> dict:
    """A configuration as JSON data: its family and every field, a dtype by its name ("float16"), so that a
    reader builds it back (`config_from_record`) without parsing its repr."""
    if type(config) not in CONFIG_FAMILIES.values():
        raise TypeError(f"config must be one of {sorted(CONFIG_FAMILIES)}, got {type(config).__name__}")
    fields = {
        f.name: str(v).removeprefix("torch.") if isinstance(v := getattr(config, f.name), torch.dtype) else v
        for f in dataclasses.fields(config)
    }
    return {"family": type(config).__name__, **fields}


def config_from_record(record: dict) -> PNMixConfig | TokenPrecisionConfig:
    """The configuration `config_record` wrote; a field this tree's family lacks, or a value it refuses, is a
    ValueError naming it (a record of other code is not read as something else)."""
    family = CONFIG_FAMILIES.get(record.get("family")) if isinstance(record, dict) else None
    if family is None:
        raise ValueError(f"config record's family must be one of {sorted(CONFIG_FAMILIES)}, got {record!r}")
    known = {f.name: f for f in dataclasses.fields(family)}
    given = {k: v for k, v in record.items() if k != "family"}
    unknown = sorted(given.keys() - known.keys())
    if unknown:
        raise ValueError(f"config record has fields {unknown} that {family.__name__} does not have")
    defaults = family()
    for name, value in given.items():
        if isinstance(getattr(defaults, name), torch.dtype):
            dtype = getattr(torch, str(value), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"config record's {name} must name a torch dtype, got {value!r}")
            given[name] = dtype
    try:
        return family(**given)
    except (TypeError, ValueError) as err:
        raise ValueError(f"config record refused by {family.__name__}: {err}") from err


# -- the environment record -------------------------------------------------------------------

#: Distributions whose versions every record names (python is added).
VERSIONED = ("torch", "triton", "transformers", "datasets", "tabulate", "matplotlib", "hypothesis", "pytest-benchmark")


def now_utc() -> str:
    """The one date format of every record: ISO 8601, UTC, whole seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def versions(distributions: tuple[str, ...] | None = None) -> dict[str, str]:
    """The installed version of each distribution ("not installed" where absent): VERSIONED and Python's
    own by default, or those given."""
    out = {"python": platform.python_version()} if distributions is None else {}
    for dist in VERSIONED if distributions is None else distributions:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def device_name(device: torch.device | str | None = None) -> str:
    """The device as a person names it: the GPU's name for CUDA ("NVIDIA H200"), "cpu (x86_64)" for
    the CPU. None means the default device: CUDA when available."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"cpu ({platform.machine()})"
    return str(device)


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        return kib / 2**20
    except (OSError, StopIteration, ValueError):
        return None


def machine() -> dict[str, str]:
    """The host, whatever device a result used: platform, CPU, memory, GPU, CUDA, TRITON_INTERPRET."""
    mem = _memory_gib()
    return {
        "platform": platform.platform(),
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
        "memory": f"{mem:.1f} GiB" if mem else "unknown",
        "gpu": device_name("cuda") if torch.cuda.is_available() else "none (torch.cuda.is_available() is False)",
        "cuda": torch.version.cuda or "none (CPU build of torch)",
        "TRITON_INTERPRET": triton_mode(),
    }


def triton_mode() -> str:
    """TRITON_INTERPRET as set, and how Triton kernels run under it: unset without CUDA means the
    interpreter too (`pnmix._runtime` sets it to 1 before any kernel is defined)."""
    value = os.environ.get("TRITON_INTERPRET")
    if value is None:
        how = (
            "compiled kernels (CUDA)"
            if torch.cuda.is_available()
            else "Triton kernels run on the interpreter (no CUDA)"
        )
        return f"unset: {how}"
    return f"{value}: " + ("Triton kernels run on the interpreter" if value not in ("", "0") else "compiled kernels")


def command_line() -> str:
    """This process's command as it was typed: `pytest ...` under pytest, a console script by its name
    (`pnmix-long-output ...`), else `python ...`."""
    if "pytest" in sys.argv[0]:
        return shlex.join(["pytest", *sys.argv[1:]])
    script = Path(sys.argv[0]).name
    if script.startswith("pnmix-") and not script.endswith(".py"):
        return shlex.join([script, *sys.argv[1:]])
    return shlex.join(["python", *sys.orig_argv[1:]])


def environment(device: torch.device | str | None = None, command: str | None = None) -> dict:
    """Where and how a result was obtained: device (the one its tensors ran on), date_utc,
    command (this process's unless given), versions, machine."""
    return {
        "device": device_name(device),
        "date_utc": now_utc(),
        "command": command or command_line(),
        "versions": versions(),
        "machine": machine(),
    }


# -- the code a result measured ----------------------------------------------------------------

#: The checkout this package runs from: recorded paths of its files are relative to it.
ROOT = Path(__file__).resolve().parents[1]
#: Folders whose files are never part of the measured code: the tests of a package, the suite's own
#: meta tests, caches.
NOT_CODE = frozenset({"tests", "meta", "__pycache__"})
#: Modules that describe a result rather than compute it: changing them changes no measurement.
BOOKKEEPING = frozenset({"reference.records"})
SITE = "site:"


def git(*args: str) -> str | None:
    """`git ARGS` in this checkout: its output, None when git fails or is missing."""
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The commit of the checkout this package runs from (None outside a git checkout)."""
    return git("rev-parse", "HEAD")


def code_files(*targets: str) -> list[Path]:
    """The source files of `targets`: dotted names of packages (every .py below them, tests left out)
    or modules (their file), as importable now; ValueError naming a target that is not found."""
    found: set[Path] = set()
    for target in targets:
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            spec = None
        if spec is None or (spec.origin is None and not spec.submodule_search_locations):
            raise ValueError(f"code target {target!r} is neither an importable package nor a module")
        if spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                found.update(
                    p.resolve()
                    for p in Path(folder).rglob("*.py")
                    if not NOT_CODE & set(p.relative_to(folder).parts[:-1])
                )
        else:
            found.add(Path(spec.origin).resolve())
    bookkeeping = {(ROOT / (name.replace(".", "/") + ".py")).resolve() for name in BOOKKEEPING}
    return sorted(found - bookkeeping)


def code_key(path: Path) -> str:
    """How a file is named in a fingerprint: relative to this checkout when inside it; an installed
    file as "site:" + its path below the import path entry that holds it (the same name on every
    machine that installs the same package); else absolute."""
    if "site-packages" not in path.parts and path.is_relative_to(ROOT):
        return path.relative_to(ROOT).as_posix()
    entries = [Path(e).resolve() for e in sys.path if e and Path(e).is_dir()]
    holders = [e for e in entries if path.is_relative_to(e) and e != ROOT]
    if holders:
        return SITE + path.relative_to(max(holders, key=lambda e: len(e.parts))).as_posix()
    return str(path)


def code_path(key: str) -> Path | None:
    """The file a fingerprint's key names on this machine (None when it is not here)."""
    if not key.startswith(SITE):
        path = Path(key) if Path(key).is_absolute() else ROOT / key
        return path if path.is_file() else None
    rel = key.removeprefix(SITE)
    for entry in sys.path:
        candidate = Path(entry or ".") / rel
        if candidate.is_file():
            return candidate
    return None


def file_digest(path: str | os.PathLike) -> str | None:
    """sha256 of a file's bytes (16 hex digits), None when it cannot be read."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def _without_docstring(body: list) -> list:
    first = body[0] if body else None
    is_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return body[1:] if is_doc else body


class _Docstrings(ast.NodeTransformer):
    """Drops the docstring of every module, class and function: words, not behaviour."""

    def generic_visit(self, node):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            node.body = _without_docstring(node.body) or [ast.Pass()]
        return super().generic_visit(node)


def code_units(path: str | os.PathLike) -> list[str] | None:
    """What a Python file does, as the digests of its top-level definitions and statements (imports left
    out, docstrings and comments dropped, line numbers and layout ignored), sorted: a function keeps its
    digest wherever it moves and however it is commented or formatted, and any change to what it
    computes gives another. None when the file cannot be read or parsed."""
    try:
        tree = _Docstrings().visit(ast.parse(Path(path).read_text(encoding="utf-8")))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    units = [
        hashlib.sha256(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]
        for node in tree.body
        if not isinstance(node, (ast.Import, ast.ImportFrom, ast.Pass))
    ]
    return sorted(units)


#: Each file's (sha256, units) the first time this process read it: a long run's record names the code
#: that was imported at its start, not what the file holds when the run ends (`loaded_code`).
_FIRST_SEEN: dict[Path, tuple[str | None, list[str] | None]] = {}


def _digests(path: Path, first: bool = True) -> tuple[str | None, list[str] | None]:
    if not first:
        return file_digest(path), code_units(path)
    if path not in _FIRST_SEEN:
        _FIRST_SEEN[path] = file_digest(path), code_units(path)
    return _FIRST_SEEN[path]


def _fingerprint(paths, targets: list[str], first: bool = False) -> dict:
    seen = {code_key(p): _digests(p, first) for p in paths}
    files = {k: sha for k, (sha, _) in seen.items()}
    return {
        "targets": targets,
        "files": files,
        "units": {k: units for k, (_, units) in seen.items() if units is not None},
        "digest": fingerprint_digest(files),
        "commit": git_commit(),
    }


def fingerprint_digest(files: dict[str, str]) -> str:
    """One digest of a {file: digest} map: equal exactly when every file and its content are."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


def code_fingerprint(*targets: str) -> dict:
    """What a result measured, so that a reader can tell whether the code in a tree is that code:
    {"targets", "files": {path: sha256}, "units": {path: `code_units`}, "digest", "commit"} (commit: the
    checkout's HEAD, None outside git; the files say more than the commit, since a tree can differ from
    its commit; the units say what the code does, which a comment, a docstring or a move leaves alone)."""
    return _fingerprint(code_files(*targets), list(targets))


#: This repository's packages of implementations: the spec and the Triton package. Code of any other
#: package here that holds an implementation (the suite's adapters, a test's plug-in) is its module.
IMPLEMENTATION_PACKAGES = ("reference", "pnmix")


#: The packages whose loaded modules are the code a tool's result measured (`loaded_code`).
MEASURED_PACKAGES = ("reference", "pnmix", "benchmarks")


def loaded_code() -> dict:
    """A fingerprint (as `code_fingerprint`'s) of the module files of MEASURED_PACKAGES that this process
    has imported: exactly the code a tool ran (its own module, the spec, the caches it used). Each file is
    read the first time this process asks (a long run calls this at its start, so that an edit made while
    it runs is not taken for the code it ran)."""
    paths = set()
    for name, module in list(sys.modules.items()):
        top = name.split(".")[0]
        file = getattr(module, "__file__", None)
        if top not in MEASURED_PACKAGES or not file or name in BOOKKEEPING or NOT_CODE & set(name.split(".")):
            continue
        path = Path(file).resolve()
        if path.is_relative_to(ROOT / top) and not path.name.startswith("test_"):
            paths.add(path)
    return _fingerprint(sorted(paths), ["modules loaded"], first=True)


def implementation_targets(module: str) -> tuple[str, ...]:
    """The code of an implementation whose factory lives in `module`: an installed plug-in's top-level
    package; here, its package of `IMPLEMENTATION_PACKAGES` or else its module, with the spec
    (`reference`) that every implementation of this repository builds on."""
    top = module.split(".")[0]
    spec = importlib.util.find_spec(top)
    inside = spec is not None and spec.origin is not None and Path(spec.origin).resolve().is_relative_to(ROOT / top)
    if not inside:
        return (top,)
    own = top if top in IMPLEMENTATION_PACKAGES else module
    return (own,) if own == "reference" else (own, "reference")


# -- files ------------------------------------------------------------------------------------


def utc_stamp() -> str:
    """A sortable UTC timestamp for file names (not a record's date), unique to the microsecond."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S_%fZ")


def umask() -> int:
    """The process's file-mode creation mask (read by setting it, then set back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, overwrite: bool = False) -> Path:
    """Write `data` to `path` so that readers see the old file or the whole new one, never a part.

    Without overwrite=True an existing file is left alone and FileExistsError is raised,
    even if it appears while writing (the final step is an exclusive link).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; choose another path or allow overwriting explicitly")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(fd, 0o666 & ~umask())  # mkstemp's 0600 would hide results from the user's group
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if path appeared meanwhile
            os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_atomic(path: str | os.PathLike, text: str, *, overwrite: bool = False) -> Path:
    """`write_bytes_atomic` for text (UTF-8)."""
    return write_bytes_atomic(path, text.encode("utf-8"), overwrite=overwrite)


def as_stored(data: object) -> object:
    """`data` as `write_json` stores it and a reader loads it back: keys sorted, tuples as lists, any other
    object as its text."""
    return json.loads(json.dumps(data, sort_keys=True, default=str))


def write_json(path: str | os.PathLike, data: object, *, overwrite: bool = False, compact: bool = False) -> Path:
    """`data` as JSON, atomically; compact=True (long per-position series) puts it on one line."""
    text = json.dumps(data, indent=None if compact else 2, sort_keys=True, default=str)
    return write_atomic(path, text + "\n", overwrite=overwrite)
