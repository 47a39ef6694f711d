"""The git state of the checkout a report ran in (the rest of its environment is `reference.records`)."""

from __future__ import annotations

import subprocess

from .provenance import ROOT


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
