"""Where and how the report ran: machine, versions, git state, date, command line."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess

import torch

from .provenance import ROOT

VERSIONED = ("torch", "triton", "transformers", "datasets", "tabulate", "matplotlib", "hypothesis", "pytest-benchmark")


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in VERSIONED:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        return kib / 2**20
    except (OSError, StopIteration, ValueError):
        return None


def machine() -> dict[str, str]:
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none (torch.cuda.is_available() is False)"
    mem = _memory_gib()
    return {
        "platform": platform.platform(),
        "cpu": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores",
        "memory": f"{mem:.1f} GiB" if mem else "unknown",
        "gpu": gpu,
        "cuda": torch.version.cuda or "none (CPU build of torch)",
        "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "unset"),
    }


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict[str, str]:
    """Commit and whether the working tree differs from it (taken before the report writes anything)."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": "unknown (not a git checkout, or git missing)", "dirty": "unknown"}
    changed = [line for line in (_git("status", "--porcelain") or "").splitlines() if line]
    dirty = f"yes: {len(changed)} changed or untracked paths" if changed else "no"
    return {"commit": commit, "branch": _git("rev-parse", "--abbrev-ref", "HEAD") or "unknown", "dirty": dirty}


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
