"""Result records: the environment every result carries, its kind tag, and atomic writes.

Every result this project writes (conformance, fidelity and gpu_check JSON, and each benchmark's
pytest-benchmark `extra_info`) carries the fields of `environment`: the device its tensors ran
on, the date (ISO 8601 UTC, seconds), the command, package versions and the machine. Files we
write ourselves also carry a "kind" tag (`record`); pytest-benchmark files are told by their own
keys (`kind_of`). Files are written atomically and never over an existing file unless asked to.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path

import torch

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
    """A result of `kind` (a key of TAGS): its tag, the environment of `device`, then `fields`
    (a field named like an environment one, such as `command`, replaces it)."""
    if kind not in TAGS:
        raise ValueError(f"kind must be one of {sorted(TAGS)}, got {kind!r}")
    return {KIND: TAGS[kind], **environment(device), **fields}


# -- the environment record -------------------------------------------------------------------

#: Distributions whose versions every record names (python is added).
VERSIONED = ("torch", "triton", "transformers", "datasets", "tabulate", "matplotlib", "hypothesis", "pytest-benchmark")


def now_utc() -> str:
    """The one date format of every record: ISO 8601, UTC, whole seconds."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in VERSIONED:
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
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "unset"),
    }


def command_line() -> str:
    """This process's command as it was typed: `pytest ...` under pytest, else `python ...`."""
    if "pytest" in sys.argv[0]:
        return shlex.join(["pytest", *sys.argv[1:]])
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


def write_json(path: str | os.PathLike, data: object, *, overwrite: bool = False, compact: bool = False) -> Path:
    """`data` as JSON, atomically; compact=True (long per-position series) puts it on one line."""
    text = json.dumps(data, indent=None if compact else 2, sort_keys=True, default=str)
    return write_atomic(path, text + "\n", overwrite=overwrite)
