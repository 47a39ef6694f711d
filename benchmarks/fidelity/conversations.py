"""Multi-turn, tool-using conversations for token-role methods (TriAxialKV), written for this project.

`benchmarks/data/conversations.jsonl`: one conversation per line (`id`, `split`, `messages` in the
chat-message format every chat template takes: a system prompt, then user turns, assistant turns
with `<think>` reasoning and `<tool_call>` calls, and `tool` results), long enough that roles and
recency to the current turn differ. The `calibration` split is for calibration, `evaluation` for
the measurements; no conversation is in both.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parents[1] / "data" / "conversations.jsonl"
SPLITS = ("calibration", "evaluation")


def load(split: str):
    """The conversations of one split, as a `datasets.Dataset` (read from the local file)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    import datasets

    every = datasets.load_dataset("json", data_files=str(DATA), split="train")
    return every.filter(lambda row: row["split"] == split)


__all__ = ["DATA", "SPLITS", "load"]
