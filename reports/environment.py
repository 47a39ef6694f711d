"""The git state of the checkout a report ran in (the rest of its environment is `reference.records`)."""

from __future__ import annotations

from reference.records import git


def git_state() -> dict[str, str]:
    """Commit and whether the working tree differs from it (taken before the report writes anything)."""
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": "unknown (not a git checkout, or git missing)", "dirty": "unknown"}
    changed = [line for line in (git("status", "--porcelain") or "").splitlines() if line]
    dirty = f"yes: {len(changed)} changed or untracked paths" if changed else "no"
    return {"commit": commit, "branch": git("rev-parse", "--abbrev-ref", "HEAD") or "unknown", "dirty": dirty}
