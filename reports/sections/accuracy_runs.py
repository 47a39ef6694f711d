"""What a task-accuracy run ran, read back from its record: its method and configuration (as data, or from lm-eval's
model_args in results of older code), and whether it is the paper's main configuration."""

from __future__ import annotations

import dataclasses

import torch

from benchmarks.accuracy.sweep import is_main
from reference import PNMixConfig, methods, records
from reference.tokens.config import TokenPrecisionConfig


def value(text: str) -> object:
    """One model_args value as lm-eval types it (`lm_eval.utils.handle_arg_string`): a bool, None, an int, a
    number, else the text."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    named = {"true": True, "false": False, "none": None}
    if text.lower() in named:
        return named[text.lower()]
    if text.lstrip("+-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def model_args(text: str) -> dict:
    """lm-eval's --model_args string as names and values ("method=PN-Mix,b_high=2": a name and an int)."""
    return {k: value(v) for k, _, v in (part.partition("=") for part in text.split(",") if part)}


def run_config(run: dict) -> tuple[str, PNMixConfig | TokenPrecisionConfig, dict] | None:
    """The method and configuration a task-accuracy run ran, and its other options (a per-token method's
    budget): as the run recorded them as data (`benchmarks.accuracy.sweep.Run.describe`), or, in results of
    older code that recorded only lm-eval's model_args, the registry's configuration with the fields they set (a
    dtype by its name); None for a run that is no registry method (an implementation given by name).
    ValueError or TypeError where the configuration refuses a value."""
    if run.get("config") is not None and run.get("method") in methods.REGISTRY:
        return run["method"], records.config_from_record(run["config"]), dict(run.get("options") or {})
    args = model_args(run.get("model_args", ""))
    name = args.pop("method", None)
    if name not in methods.REGISTRY:
        return None
    default = methods.config(name)
    fields = {f.name: getattr(default, f.name) for f in dataclasses.fields(default)}
    given = {
        k: getattr(torch, v) if isinstance(fields[k], torch.dtype) and isinstance(v, str) else v
        for k, v in args.items()
        if k in fields
    }
    return name, methods.config(name, **given), {k: v for k, v in args.items() if k not in fields}


def is_paper_main(run: dict) -> bool:
    """Whether `run` ran the paper's main configuration (`benchmarks.accuracy.sweep.is_main`): as it records, or in
    results of older code as its configuration rebuilt by `run_config` is."""
    if "paper_main" in run:
        return bool(run["paper_main"])
    try:
        ran = run_config(run)
    except (ValueError, TypeError, AttributeError):  # a value this tree's configurations refuse
        return False
    return ran is not None and is_main(ran[1])
