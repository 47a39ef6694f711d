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
