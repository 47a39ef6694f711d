"""The documents of a pnmix_* task, for lm-eval's `custom_dataset`: read from ../data next to this
folder, so that the configs work from any working directory (`--include_path` is all they need)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"


def load_docs(data_file: str, **_metadata) -> dict:
    """{"test": the documents of `data_file`} as a `datasets.Dataset`; lm-eval also passes the task's
    metadata (and --metadata), which the documents do not depend on."""
    import datasets

    path = DATA / data_file
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; write it with python -m benchmarks.tasks.generate")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    return {"test": datasets.Dataset.from_list(docs)}


#: Trailing punctuation a produced answer may carry ("5831." or "QPX,"), not part of the answer.
PUNCTUATION = ".,;:!?\"'"


def first_answer(text: str) -> str:
    """The first word of a produced answer, trailing punctuation removed ("" when nothing was produced)."""
    words = text.split()
    return words[0].rstrip(PUNCTUATION) if words else ""


def score_generation(doc: dict, results: list[str]) -> dict:
    """lm-eval's `process_results` of a generation variant: exact is 1 when the answer produced is the
    gold candidate (its first word against the candidate, both stripped), else 0."""
    return {"exact": int(first_answer(results[0]) == doc["choices"][doc["gold"]].strip())}
