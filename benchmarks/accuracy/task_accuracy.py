"""Task accuracy against key bits on real models, offline, through lm-evaluation-harness (the paper's
Table 2, Fig. 3 / Table 14 and Table 8):

    pnmix-task-accuracy [--model M] [--tasks NAME ...] [--limit N] [--budgets 3 2.5 ...]

Every run of the sweep (`benchmarks.accuracy.sweep.plan`: FP16; PN-Mix and KIVI at the configuration
of their family nearest each key-bit budget; KIVI-2 +32 sinks, Kitty, TriAxialKV, role-aware PN-Mix and
transformers' QuantizedCache (quanto) at their own bits; keys only against values only) is evaluated by
lm-eval on the same documents, through the "pnmix" model class (`benchmarks.accuracy.lm_eval_model`). The
model runs over each prompt once: exact prefill attention is the same whatever the cache, so every
run's cache starts from that one forward (`PNMixLM.score_shared`), and only what comes after the
prompt (the tokens after `benchmarks.tasks.DECODE_MARK`, then each answer) runs per method. Both kinds
of task are scored: multiple choice (each candidate's log-likelihood; the suite's `pnmix_<task>_<len>`)
and generation (each run decodes greedily through its own cache from the shared prompt forward; the
suite's `pnmix_<task>_gen_<len>`, lm-eval's own generate_until tasks). lm-eval then scores each run
(its own metrics and per-document samples); a task's first metric, right or wrong per document, is
the outcome recorded.

Extendable: `--extend RESULT` runs only the runs of the plan (or of --runs) that an earlier result lacks, on its
tasks and documents, FP16 again as the check that they pair item by item, and writes the earlier result merged
with them (`benchmarks.accuracy.extension`): a run added to the plan is measured without running the others again.

Resumable: every finished context's scores are appended to a file in --out (`Scores`); an interrupted
sweep says what it kept and the same command resumes from it, with any number of processes. A score is
kept under its run's configuration, so a sweep runs in pieces (some runs, some tasks, a few documents
first) and a last one over everything scores only what no piece did. Pieces combine only where made in the
same dtype on the same kind of device (float32 on the CPU, bfloat16 on CUDA by default: two computations)
by code whose canaries still reproduce; any other piece, and a kept line edited, swapped or out of range, is
refused in one line naming its file (and line). A sweep holds a lock on its --out (`sweep_lock`): a second one
there is refused, naming the holder. Data-parallel under lm-eval's own multi-process launch: `torchrun
--standalone --nproc_per_node N -m benchmarks.accuracy.task_accuracy ...` gives each process its share of the
documents (its own model copy, one GPU each where there are GPUs) and rank 0 gathers them and writes the one result.

The result (JSON, kind "task-accuracy", and a markdown summary, in benchmarks/results/ or --out) holds
every document's outcome per run and task, so that the report pairs each method with FP16 on the same
items (exact McNemar) and gives Wilson intervals (`benchmarks.accuracy.stats`). Bad arguments (an
unknown task, a hub task whose data is not cached while the hub is off or out of reach, a run that does
not exist, a task longer than the model's context, a model file that cannot load, a model without RoPE
or whose RoPE pair layout its code does not tell and --pair-layout does not give, an `--out` that cannot
be written or that another sweep holds) are refused in one line before the model loads
(`benchmarks.commands.preflight`). The result records its dtype and kind of device (`device_class`).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import math
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.accuracy import extension
from benchmarks.accuracy import sweep as accuracy_sweep
from benchmarks.accuracy.model_args import ModelArgsError, check
from benchmarks.canaries import behaviour as canaries
from benchmarks.canaries import pipelines
from benchmarks.canaries.outcome import outcome
from benchmarks.commands import interrupts, preflight
from benchmarks.commands.heap import trimmed
from benchmarks.commands.saving import write_result
from benchmarks.models import source as model_source
from benchmarks.tasks import DATA, DECODE_MARK, data_file, parse_task_name
from reference import schema
from reference.records import file_digest, loaded_code, now_utc, record, write_atomic

RESULTS = Path(__file__).parents[1] / "results"
CONFIGS = Path(__file__).parents[1] / "tasks" / "configs"
#: The suite's lengths, and the one run by default and by --smoke (a few documents of the shortest).
LENGTHS = ("1k", "2k", "4k", "8k")
DEFAULT_LENGTHS = ("1k",)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pnmix-task-accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=model_source.DEFAULT, help="a .gguf, a transformers folder or a model package")
    p.add_argument("--tasks", nargs="+", default=None, help="lm-eval task names (default: the suite at --lengths)")
    p.add_argument("--lengths", nargs="+", choices=LENGTHS, default=list(DEFAULT_LENGTHS), help="the suite's lengths")
    p.add_argument("--limit", type=int, default=None, help="documents per task (default: all)")
    p.add_argument("--budgets", type=float, nargs="+", default=list(accuracy_sweep.BUDGETS), help="key-bit budgets")
    p.add_argument("--runs", nargs="+", default=None, help="only the runs with these labels (FP16 always runs)")
    p.add_argument("--smoke", action="store_true", help="2 documents of 2 tasks, 3 runs: checks the pipeline")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: the cores this process may use)")
    p.add_argument(
        "--include-path",
        type=Path,
        action="append",
        default=[],
        help="more lm-eval task folders (beside the suite's benchmarks/tasks/configs)",
    )
    p.add_argument(
        "--pair-layout",
        choices=("split", "adjacent"),
        default=None,
        help="the model's RoPE pair layout where it cannot be told from its code (split: rotate_half; adjacent: "
        "interleaved pairs); refused where it contradicts the model's",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="where the result files go")
    p.add_argument(
        "--extend",
        type=Path,
        default=None,
        metavar="RESULT",
        help="an earlier task-accuracy result: run only the runs it lacks (FP16 again, as the check that they pair) "
        "on its tasks and documents, and write it merged with them",
    )
    return p


def task_index(include_path: list[str], tasks) -> object:
    """lm-eval's task index over `include_path`, and over lm-eval's own tasks too unless every task named is a
    single task there: indexing lm-eval's own reads every YAML it ships (seconds, in every process of a launch).
    A group or tag is indexed whole, since its members may be lm-eval's own tasks."""
    from lm_eval.tasks import TaskManager  # deferred: lm-eval takes seconds to import

    ours = TaskManager(include_path=include_path, include_defaults=False)
    if all(t in ours.all_subtasks for t in tasks):
        return ours
    return TaskManager(include_path=include_path)


def suite_tasks(lengths, manager) -> list[str]:
    names = sorted(n for n in manager.all_tasks if n.startswith("pnmix_") and n.rsplit("_", 1)[-1] in lengths)
    return [n for n in names if n in manager.all_subtasks]


def check_ranges(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The numbers and folders given, before anything is read; one line each."""
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit must be a positive number of documents, got {args.limit}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be positive, got {args.threads}")
    for b in args.budgets:
        if not 1.0 <= b <= 16.0:
            p.error(f"--budgets must be key bits between 1 and 16, got {b}")
    labels = [f"{b:g}" for b in args.budgets]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        p.error(f"--budgets: {', '.join(twice)} given twice (runs are named by their budget); give each once")
    if args.smoke and (args.runs or args.budgets != list(accuracy_sweep.BUDGETS)):
        p.error(
            "--smoke runs its own pipeline check (FP16, PN-Mix @ 2.25, KIVI @ 2.25): leave out --runs and --budgets"
        )
    for folder in args.include_path:
        if not folder.is_dir():
            p.error(f"--include-path {folder}: no such folder")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace, manager, source) -> tuple[list[str], object]:
    """What needs the task index and the model's config, not its weights: tasks, and their lengths against
    the model's context; one line each."""
    tasks = args.tasks or suite_tasks(args.lengths, manager)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        p.error(
            f"--tasks: unknown task(s) {unknown}; the suite's are {suite_tasks(('1k', '2k', '4k', '8k'), manager)}"
            f" (lm-eval's own tasks are found too, offline data only)"
        )
    if not tasks:
        p.error(f"--lengths {args.lengths}: no task of the suite at these lengths")
    from benchmarks.accuracy.lm_eval_cli import offline_tasks  # deferred: lm-eval takes seconds to import

    offline = offline_tasks(tasks, None, manager)
    if offline:
        p.error(f"--tasks: {offline}")
    config = source.config()
    context = int(getattr(config, "max_position_embeddings", None) or 2048)
    too_long = [t for t in tasks if task_tokens(t) is not None and task_tokens(t) > context]
    if too_long:
        p.error(f"--tasks {too_long}: longer than the model's context ({context} tokens)")
    return tasks, config


def pair_layout(p: argparse.ArgumentParser, args: argparse.Namespace, config) -> str:
    """The RoPE pair layout every run's caches take: the model's, probed from its code, else --pair-layout;
    one line refusing a model without RoPE, a layout that cannot be told and is not given, or one that
    contradicts the model's."""
    from pnmix.hf import detect_pair_layout, has_rope  # deferred: transformers takes seconds to import

    if has_rope(config) is False:
        p.error(
            f"--model {args.model}: no rotary position embedding (RoPE); PN-Mix's pairs are the channel pairs "
            "RoPE rotates together"
        )
    detected = detect_pair_layout(config)
    if detected is None and args.pair_layout is None:
        p.error(
            f"--pair-layout: cannot tell the RoPE pair layout of {args.model} from its code; give --pair-layout "
            "split (rotate_half) or adjacent (interleaved pairs)"
        )
    if detected is not None and args.pair_layout not in (None, detected):
        p.error(f"--pair-layout {args.pair_layout}: this model's RoPE pairs are {detected!r}")
    return detected or args.pair_layout


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def task_tokens(name: str) -> int | None:
    """The context length a suite task's name says (pnmix_passkey_4k: 4096), None for other tasks."""
    tail = name.rsplit("_", 1)[-1]
    if name.startswith("pnmix_") and tail.endswith("k") and tail[:-1].isdigit():
        return int(tail[:-1]) * 1024
    return None


def _request_key(args: tuple) -> str:
    return hashlib.sha256(json.dumps(args).encode()).hexdigest()[:32]


#: The run_key of a kept file's lines that record a context's seconds.
TIME = "seconds"
#: A context's scores take minutes on a CPU; a kept time past a week is a damaged line, not a measurement.
MAX_CONTEXT_SECONDS = 7 * 24 * 3600.0
#: The lock a sweep holds on its --out, holding its holder's pid, host, start and command.
LOCK = ".task-accuracy.lock"


def run_key(model_args: str) -> str:
    """What a kept score is filed under: the run's configuration (its model_args), not its label."""
    return hashlib.sha256(model_args.encode()).hexdigest()[:16]


class KeptFileError(ValueError):
    """A kept-scores file (or the --out lock) that cannot be read or written: one line naming the file, and the
    line where one is read."""


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def computation(dtype, device) -> dict:
    """What a kept score was computed in: the model's dtype (a torch dtype) and the kind of its device (a torch
    device: "cpu", "cuda"). Pieces of a sweep combine only where these are equal: another dtype rounds every
    activation otherwise, and a GPU runs other kernels (the Triton caches in half precision, cuBLAS) than the CPU."""
    return {"dtype": str(dtype).removeprefix("torch."), "device": device.type}


def score_problem(score) -> str:
    """What is wrong with a kept score as JSON holds it ("" if nothing): the text generated, or [log-likelihood,
    greedy] with a finite log-likelihood <= 0."""
    if isinstance(score, str):
        return ""
    if not (isinstance(score, list) and len(score) == 2):
        return f"score {json.dumps(score)}: expected [log-likelihood, greedy] or the text generated"
    log_p, greedy = score
    if isinstance(log_p, bool) or not isinstance(log_p, (int, float)) or not math.isfinite(log_p) or log_p > 0:
        return f"log-likelihood {json.dumps(log_p)}: expected a finite number <= 0"
    if not isinstance(greedy, bool):
        return f"greedy {json.dumps(greedy)}: expected true or false"
    return ""


def seconds_problem(seconds) -> str:
    """What is wrong with a context's kept seconds ("" if nothing): finite, 0 to MAX_CONTEXT_SECONDS."""
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not number or not math.isfinite(seconds) or not 0 <= seconds <= MAX_CONTEXT_SECONDS:
        return f"seconds {json.dumps(seconds)}: expected a context's time, 0 to {MAX_CONTEXT_SECONDS:g}"
    return ""


def kept_lines(path: Path) -> list[str]:
    """The whole lines of a kept file; a last line without its newline (a write a kill cut short) is left out."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise KeptFileError(f"{path}: a folder where the sweep keeps a file of scores; remove it") from None
    except OSError as err:
        raise KeptFileError(f"{path}: cannot be read ({err.strerror or err})") from None
    out = []
    for n, line in enumerate(data.split(b"\n")[:-1], 1):
        try:
            out.append(line.decode())
        except UnicodeDecodeError:
            raise KeptFileError(f"{path} line {n}: not UTF-8 text; remove the file to start over") from None
    return out


def kept_head(path: Path, lines: list[str]) -> dict | None:
    """A kept file's first line (its identity, computation and behaviour); None where it has none yet."""
    if not lines:
        return None
    try:
        head = json.loads(lines[0])
    except ValueError:
        head = None
    if not isinstance(head, dict) or not isinstance(head.get("identity"), dict):
        raise KeptFileError(
            f"{path} line 1: not a kept-scores header (a JSON object with the sweep's identity); "
            "remove the file to start over"
        )
    return head


def kept_row(path: Path, n: int, line: str, head_digest: str) -> tuple[str, str, object]:
    """(run_key, request key, score) of a kept file's line `n`, checked: its values in range and its digest that
    of its run, request and score under its file's header."""
    try:
        row = json.loads(line)
    except ValueError as err:
        raise KeptFileError(f"{path} line {n}: not JSON ({err}); remove the file to start over") from None
    if isinstance(row, list) and len(row) == 3:
        raise KeptFileError(
            f"{path} line {n}: no digest (kept by an earlier version of the sweep); remove the file to start over"
        )
    if not (isinstance(row, list) and len(row) == 4 and all(isinstance(row[i], str) for i in (0, 1, 3))):
        raise KeptFileError(
            f"{path} line {n}: expected [run, request, score, digest], got {line[:80]}; remove the file to start over"
        )
    run, key, score, digest = row
    problem = seconds_problem(score) if run == TIME else score_problem(score)
    if problem:
        raise KeptFileError(f"{path} line {n}: {problem}; remove the file to start over")
    if digest != _digest(head_digest, run, key, score):
        raise KeptFileError(
            f"{path} line {n}: its digest is not that of its run, request and score (the line was edited or "
            "moved); remove the file to start over"
        )
    return run, key, score


class Scores:
    """The sweep's scores as they are made, one line per (run, request) appended as each context finishes,
    so that an interrupted sweep keeps what it computed and a rerun resumes from it.

    A sweep reads every file of its `identity` (model file, pair layout, lm-eval's version) in the folder:
    those of an interrupted run of the same command, of other processes of a multi-process launch whatever
    their number, and of earlier sweeps over other runs or tasks, since a score is filed under its run's
    configuration and its request (a sweep can be run in pieces, by runs or by tasks, and a last one over
    everything reuses them all). Each file's first line records the `computation` (dtype and kind of device)
    and the behaviour of the code that wrote it (`benchmarks.canaries.behaviour.record`): a file of another
    computation, or whose canaries this tree no longer reproduces, is refused, saying why, so that no result
    mixes the scores of two computations. Each later line carries the digest of its run, request and score under
    that first line: a line edited, swapped or moved is refused, naming its file and line, as is a value out of
    range. This process appends to its own file, `path`. A last line cut short by a kill is not read (and is
    dropped before this process appends). `remove` deletes every file of the identity once the result holds
    their scores: one sweep at a time per folder (`sweep_lock`)."""

    def __init__(self, folder: Path, identity: dict, behaviour: dict, part: str = "", *, made_in: dict) -> None:
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        self.pattern = f".task-accuracy-{digest}*.scores.jsonl"
        self.path = folder / f".task-accuracy-{digest}{part}.scores.jsonl"
        self.identity, self.behaviour, self.made_in = identity, behaviour, made_in
        self.kept: dict[str, dict[str, tuple[float, bool] | str]] = {}
        self.seconds = 0.0  # the time the kept scores took to compute, wherever they were made
        self._head_digest: str | None = None  # that of this process's file's first line, once it has one
        for path in sorted(folder.glob(self.pattern)):
            for run, key, score in self._read(path):
                if run == TIME:
                    self.seconds += score
                else:
                    self.kept.setdefault(run, {})[key] = score if isinstance(score, str) else (score[0], score[1])
        self.read = sum(map(len, self.kept.values()))

    def _read(self, path: Path) -> list[tuple[str, str, object]]:
        """The checked rows of one kept file, whose header must be this sweep's."""
        lines = kept_lines(path)
        head = kept_head(path, lines)
        if head is None:  # empty, or its header cut short: nothing kept yet
            return []
        self._check_head(path, head)
        head_digest = _digest(lines[0])
        return [kept_row(path, n, line, head_digest) for n, line in enumerate(lines[1:], 2)]

    def _check_head(self, path: Path, head: dict) -> None:
        if head["identity"] != self.identity:
            raise KeptFileError(f"{path} line 1: holds the scores of another sweep; remove it or choose another --out")
        theirs = head.get("computation")
        if not isinstance(theirs, dict):
            raise KeptFileError(
                f"{path} line 1: records no dtype and device (kept by an earlier version of the sweep); "
                "remove it to start over"
            )
        if theirs != self.made_in:
            raise KeptFileError(
                f"{path} line 1: scores computed in {theirs.get('dtype')} on {theirs.get('device')}, this sweep "
                f"computes in {self.made_in['dtype']} on {self.made_in['device']}: a different computation (another "
                "dtype rounds every activation otherwise, a GPU runs other kernels than the CPU), so they do not "
                "combine; resume it with the same dtype on the same kind of device, or remove it to start over"
            )
        moved = canaries.moved(head.get("behaviour") or {}, PIPELINE)
        if moved or not (head.get("behaviour") or {}).get("canaries"):
            why = "; ".join(moved) if moved else "it records no canaries"
            raise KeptFileError(
                f"{path} line 1: holds scores of code that computes otherwise ({why}); remove it to start over"
            )

    def get(self, run: str, args: tuple) -> tuple[float, bool] | str | None:
        """The kept score of `args` under the run whose `run_key` is `run`, or None."""
        return self.kept.get(run, {}).get(_request_key(args))

    def add(self, rows: list[tuple[str, tuple, tuple[float, bool] | str]], seconds: float) -> None:
        """Append the scores (log-likelihoods, or the text generated) of one finished context (one write):
        rows of (run_key, request args, score), and the seconds they took. A score out of range is refused
        before anything is written (ValueError); a failed write (a full disk) says what is kept (KeptFileError)."""
        plain = [(run, _request_key(args), _plain(s)) for run, args, s in rows]
        for run, _, score in plain:
            if problem := score_problem(score):
                raise ValueError(f"run {run}: {problem}: not kept")
        time_row = (TIME, "", round(seconds, 3))
        if problem := seconds_problem(time_row[2]):
            raise ValueError(f"a context's {problem}: not kept")
        try:
            head_digest = self._head_digest or self._prepare()
            lines = [json.dumps([*row, _digest(head_digest, *row)]) for row in [*plain, time_row]]
            with open(self.path, "a") as f:
                f.write("".join(f"{line}\n" for line in lines))
        except OSError as err:
            kept = sum(map(len, self.kept.values()))
            raise KeptFileError(
                f"{self.path}: this context's scores cannot be kept ({err.strerror or err}); the {kept} scores kept "
                f"before it are in {self.path.parent}, and the same command resumes from them once it can write there"
            ) from None
        self.seconds += seconds
        for run, args, score in rows:
            self.kept.setdefault(run, {})[_request_key(args)] = score

    def _prepare(self) -> str:
        """This process's file ready to append to (a last line cut short dropped, the header written where there
        is none), and the digest of its header."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            data = b""
        whole = data[: data.rfind(b"\n") + 1]
        if not whole:
            head = json.dumps({"identity": self.identity, "computation": self.made_in, "behaviour": self.behaviour})
            write_atomic(self.path, head + "\n", overwrite=True)
        else:
            if whole != data:
                os.truncate(self.path, len(whole))
            head = whole[: whole.find(b"\n")].decode()
        self._head_digest = _digest(head)
        return self._head_digest

    def recorded(self) -> tuple[int, float]:
        """How many contexts are kept and the seconds they took, read from every file now (every process's,
        every piece's)."""
        times = [s for path in self.path.parent.glob(self.pattern) for run, _, s in self._read(path) if run == TIME]
        return len(times), sum(times)

    def remove(self) -> None:
        for path in self.path.parent.glob(self.pattern):
            path.unlink(missing_ok=True)


def _plain(score: tuple[float, bool] | str) -> list | str:
    return score if isinstance(score, str) else list(score)


def _holder(record: bytes) -> str:
    """A lock's holder as a reader reads it, from the record it wrote."""
    try:
        h = json.loads(record)
        return f"pid {h['pid']} on {h['host']}, since {h['started_utc']}: `{h['command']}`"
    except (ValueError, TypeError, KeyError):
        return "its holder not yet recorded" if not record.strip() else "its holder's record unreadable"


def _lock_fd(path: Path, out: Path) -> int:
    """An open descriptor of `path` holding its exclusive flock; KeptFileError where another process holds it or
    the file cannot be locked. Retried where the holder removed the file between its open and its lock."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise KeptFileError(f"{path}: cannot be opened as the sweep's lock ({err.strerror or err})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(os.pread(fd, 4096, 0))
            os.close(fd)
            raise KeptFileError(
                f"{out}: another sweep writes there ({holder}); wait for it to end, or give another --out"
            ) from None
        except OSError as err:
            os.close(fd)
            raise KeptFileError(
                f"{path}: cannot be locked ({err.strerror or err}); give an --out on a disk that takes file locks"
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    raise KeptFileError(f"{path}: removed and remade as it was locked, three times; retry")


def _record_holder(fd: int, path: Path) -> None:
    """This process as the holder of the lock `fd` (what a refused sweep names)."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "started_utc": now_utc(), "command": " ".join(sys.argv)}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
    except OSError as err:
        raise KeptFileError(f"{path}: this sweep cannot record itself as its holder ({err.strerror or err})") from None


@contextlib.contextmanager
def sweep_lock(out: Path):
    """Hold `out`'s lock (LOCK: an exclusive flock, which the system drops when its holder ends, however it
    ends) while the block runs: one sweep at a time per folder, since a finished sweep removes the kept files
    of its identity there. Yields the holder that a stale lock file names (one whose process is gone, now
    taken over), or None. KeptFileError, naming the holder, where another sweep holds it."""
    path = out / LOCK
    fd = _lock_fd(path, out)
    try:
        stale = os.pread(fd, 4096, 0)
        _record_holder(fd, path)
        yield _holder(stale) if stale.strip() else None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # before the lock goes: a process that opened this file sees it is gone, and retries
        os.close(fd)


class Shared:
    """The log-likelihoods and generations of every run for the requests lm-eval makes, the prompt's
    forward shared."""

    def __init__(self, base, views: dict, scores: Scores | None = None, keys: dict | None = None) -> None:
        self.base, self.views = base, views  # label -> PNMixLM sharing base's model
        self.table: dict[str, dict[tuple, tuple[float, bool]]] = {label: {} for label in views}
        self.generations: dict[str, dict[str, str]] = {label: {} for label in views}  # by _request_key
        self.scores = scores  # what earlier runs of the sweep (or of some of its runs) computed
        self.keys = keys or {label: label for label in views}  # label -> the run_key its scores are kept under
        self.reused = 0  # contexts whose scores all came from them
        self.partly = 0  # contexts where some runs' scores did

    def _kept(self, args: list[tuple]) -> dict[str, list]:
        """{label: the kept scores of `args` (None where not kept)} of every run."""
        get = self.scores.get if self.scores is not None else (lambda run, a: None)
        return {label: [get(self.keys[label], a) for a in args] for label in self.views}

    def _reuse(self, kept: dict[str, list]) -> list[str]:
        """The labels whose scores `kept` lacks (to compute), counting the context as (partly) reused."""
        missing = [label for label, scores in kept.items() if None in scores]
        if len(missing) < len(kept):
            self.reused += not missing
            self.partly += bool(missing)
        return missing

    def compute(self, requests) -> None:
        import torch

        with torch.no_grad():  # scoring only: no autograd graph over the model's forwards
            self._compute(requests)

    def _compute(self, requests) -> None:

        groups: dict[str, list] = {}
        tasks: dict[tuple, str] = {}
        for r in requests:
            groups.setdefault(r.args[0], []).append(r.args)
            tasks[r.args] = r.task_name
            n = len(self.base.tok_encode(r.args[0].replace(DECODE_MARK, "") + r.args[1]))
            if n > self.base.max_length + 1:  # as pnmix-lm-eval refuses it: nothing is truncated
                self.base.refuse_length((r.task_name, r.doc_id), n - 1, "context + continuation")
        for context, pairs in trimmed(tqdm(groups.items(), desc="contexts", unit="context", file=sys.stderr)):
            kept = self._kept(pairs)
            missing = self._reuse(kept)
            for label in self.views.keys() - set(missing):
                self.table[label].update(zip(pairs, kept[label], strict=True))
            if not missing:
                continue
            began = time.monotonic()
            encoded = [
                self.base.encode_pair(*a) if a[0] else ([self.base.prefix_token_id], self.base.tok_encode(a[1]))
                for a in pairs
            ]
            context_enc = encoded[0][0]
            prompt = self.base.prompt_length(context, context_enc)
            for args, (_, continuation) in zip(pairs, encoded, strict=True):
                self.base.warn_if_cache_blind(tasks[args], context_enc, prompt, continuation)
            recorded = self.base.record_prompt(context_enc[:prompt])
            text = context.replace(DECODE_MARK, "").rstrip()
            rows = []
            for label in missing:
                scores = self.views[label].score_shared(text, context_enc, prompt, [c for _, c in encoded], recorded)
                self.table[label].update(zip(pairs, scores, strict=True))
                rows += [(self.keys[label], a, s) for a, s in zip(pairs, scores, strict=True)]
            if self.scores is not None:
                self.scores.add(rows, time.monotonic() - began)

    def generate(self, requests) -> None:
        import torch

        with torch.no_grad():
            self._generate(requests)

    def _generate(self, requests) -> None:
        """Each run decodes greedily through its own cache, from the one exact forward over the prompt
        (`PNMixLM.record_prompt`) and the decode section as its own steps (`PNMixLM.replayed`)."""
        for r in trimmed(tqdm(requests, desc="generations", unit="context", file=sys.stderr)):
            key = _request_key(r.args)
            kept = self._kept([r.args])
            missing = self._reuse(kept)
            for label in self.views.keys() - set(missing):
                self.generations[label][key] = kept[label][0]
            if not missing:
                continue
            began = time.monotonic()
            ask = self.base.generation(r)
            recorded = self.base.record_prompt(ask.context_enc[: ask.prompt])
            rows = []
            for label in missing:
                lm = self.views[label]
                cache, last = lm.replayed(ask.text, ask.context_enc, ask.prompt, recorded)
                self.generations[label][key] = text = lm.generated(cache, last, ask)
                rows.append((self.keys[label], r.args, text))
            if self.scores is not None:
                self.scores.add(rows, time.monotonic() - began)


def evaluate(tasks: list[str], limit: int | None, manager, shared: Shared) -> dict[str, dict | None]:
    """lm-eval's results of every run: {label: simple_evaluate's output} (None on ranks other than 0 of a
    multi-process launch: lm-eval gathers the documents' outcomes on rank 0)."""
    import lm_eval
    from lm_eval.api.model import LM

    base = shared.base

    class Replay(LM):
        """A run's log-likelihoods and generations, computed beforehand (`Shared`): the first run's pass
        computes every run's. Under a multi-process launch lm-eval gives each rank its share of the
        documents (the rank and world size are the loaded model's, `PNMixLM`) and gathers on rank 0."""

        def __init__(self, label: str) -> None:
            super().__init__()
            self.label = label
            self._rank, self._world_size = base.rank, base.world_size

        def all_gather(self, tensor):
            return base.all_gather(tensor)

        def gather_object(self, obj, dst: int = 0):
            return base.gather_object(obj, dst)

        def barrier(self) -> None:
            base.barrier()

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            if not shared.table[self.label]:
                shared.compute(requests)
            return [shared.table[self.label][r.args] for r in requests]

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            task = requests[0].task_name if requests else "?"
            raise ValueError(
                f"task {task}: a loglikelihood_rolling (perplexity) task; the sweep scores multiple-choice and "
                "generation tasks (pnmix-lm-eval scores the others)"
            )

        def generate_until(self, requests, disable_tqdm: bool = False):
            if not shared.generations[self.label]:
                shared.generate(requests)
            return [shared.generations[self.label][_request_key(r.args)] for r in requests]

    out = {}
    for label in shared.views:
        out[label] = lm_eval.simple_evaluate(
            model=Replay(label),
            tasks=tasks,
            limit=limit,
            log_samples=True,
            task_manager=manager,
            bootstrap_iters=0,
            verbosity="ERROR",
        )
    return out


#: The kinds of task the sweep scores: a candidate chosen, an answer produced.
OUTPUTS = ("multiple_choice", "generate_until")


def output_type(result: dict, task: str) -> str:
    kind = result["configs"][task]["output_type"]
    if kind not in OUTPUTS:
        raise ValueError(f"task {task}: output_type {kind}; the sweep scores {' and '.join(OUTPUTS)} tasks")
    return kind


def outcomes(result: dict, task: str) -> list[int]:
    """Each document's outcome by the task's first metric (acc for the suite's multiple-choice tasks, exact
    for its generation variants), in document order; it must be right or wrong (1 or 0)."""
    metric = result["configs"][task]["metric_list"][0]["metric"]
    samples = sorted(result["samples"][task], key=lambda s: s["doc_id"])
    values = [s[metric] for s in samples]
    if any(v not in (0, 1) for v in values):
        raise ValueError(f"task {task}: metric {metric} is not right-or-wrong per document (values {values[:5]})")
    return [int(v) for v in values]


def chance(result: dict, task: str) -> float:
    """Accuracy by guessing: 1 / candidates for multiple choice, 0 for an answer produced."""
    if output_type(result, task) == "generate_until":
        return 0.0
    samples = result["samples"][task]
    return sum(1 / len(s["arguments"]) for s in samples) / len(samples)


def task_paths(tasks: list[str]) -> dict[str, Path]:
    """The data file of each suite task run that has one."""
    out = {}
    for t in tasks:
        parsed = parse_task_name(t)
        path = None if parsed is None else DATA / data_file(parsed[0], parsed[1])
        if path is not None and path.is_file():
            out[t] = path
    return out


def task_files(tasks: list[str]) -> dict[str, str]:
    """sha256 of the data file of each suite task run (the documents are data, not code: recorded apart)."""
    return {t: file_digest(path) for t, path in task_paths(tasks).items()}


def quantized_layers(model_config) -> dict:
    """How many of the model's attention layers hold the method's cache: a layer with an attention window keeps
    an exact one (`pnmix.hf`), so a run's bits are those of the other layers only."""
    import pnmix.hf  # deferred: transformers takes seconds to import

    windows = pnmix.hf.layer_windows(model_config)
    return {"quantized": sum(w is None for w in windows), "total": len(windows)}


def layers_note(data: dict) -> str:
    """What the bits of a result cover, where some layers keep exact caches; "" where every layer is quantized
    (or the result does not say)."""
    layers = data.get("layers")
    if not isinstance(layers, dict) or layers.get("quantized") == layers.get("total"):
        return ""
    return (
        f"{layers['quantized']} of {layers['total']} attention layers hold the method's cache; the others have an "
        "attention window and keep exact caches, so key and value bits are those of the quantized layers alone"
    )


def extended_from(earlier: dict) -> str:
    """What an --extend merged in, as a result's markdown and the report say it."""
    runs, file = ", ".join(earlier["runs"]), earlier["file"]
    return f"runs {runs} from `{file}` ({earlier['date_utc']}, `{earlier['command']}`); "


def markdown(data: dict) -> str:
    from tabulate import tabulate

    head = ["run", "key bits", "value bits", *(t["name"] for t in data["tasks"])]
    rows = [
        [
            r["label"],
            r.get("key_bits"),
            r.get("value_bits"),
            *(f"{sum(r['results'][t['name']]['correct']) / t['items']:.2f}" for t in data["tasks"]),
        ]
        for r in data["runs"]
    ]
    return (
        f"# Task accuracy: {data['model']}\n\nMeasured on {data['device']}"
        + (f" in {data['dtype']}" if "dtype" in data else "")
        + f", {data['date_utc']}, `{data['command']}`; "
        f"{sum(t['items'] for t in data['tasks'])} documents; "
        + (f"{note}; " if (note := layers_note(data)) else "")
        + "".join(map(extended_from, data.get("extends", [])))
        + "chance per task: "
        + ", ".join(f"{t['name']} {t['chance']:.2f}" for t in data["tasks"])
        + "\n\n"
        + tabulate(rows, head, tablefmt="github", floatfmt=".3f")
        + "\n"
    )


def extended(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict | None:
    """The earlier result of --extend, read and checked; its tasks and documents per task become the sweep's
    (others given are refused)."""
    if args.extend is None:
        return None
    if args.smoke:
        p.error("--extend: --smoke checks the pipeline on its own runs; leave one of them out")
    try:
        data = extension.load(args.extend, KIND)
    except extension.ExtensionError as err:
        p.error(f"--extend: {err}")
    names = [t["name"] for t in data["tasks"]]
    if args.tasks is not None and args.tasks != names:
        p.error(f"--tasks: the result extended ran {names}; leave --tasks out")
    if args.limit is not None and args.limit != data.get("limit"):
        p.error(f"--limit: the result extended ran {data.get('limit')} documents per task; leave --limit out")
    args.tasks, args.limit = names, data.get("limit")
    return data


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    check_ranges(p, args)
    args.earlier = extended(p, args)
    source = preflight.model(p, args.model)  # the suite's prompts are plain text: no chat template needed
    args.out = preflight.output_folder(p, args.out)
    # rank 0 holds the lock for every process of a launch (the launcher ends them all where it refuses)
    rank = int(os.environ.get("RANK", "0")) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else 0
    with contextlib.ExitStack() as held:
        if rank == 0:
            try:
                stale = held.enter_context(sweep_lock(args.out))
            except KeptFileError as err:
                p.error(f"--out: {err}")
            if stale:
                print(f"{p.prog}: took over {args.out / LOCK} from a sweep that is gone ({stale})", file=sys.stderr)
        return sweep(p, args, source)


def sweep(p: argparse.ArgumentParser, args: argparse.Namespace, source) -> int:
    """The sweep of `main`'s checked arguments, with `args.out` held: the exit status."""
    manager = task_index([str(CONFIGS), *map(str, args.include_path)], args.tasks or ())
    tasks, config = check_args(p, args, manager, source)
    limit = args.limit
    from benchmarks.accuracy.lm_eval_model import PNMixLM, RequestTooLong  # deferred: lm-eval takes seconds

    d, layout = head_dim(config), pair_layout(p, args, config)
    runs = accuracy_sweep.plan(d, args.budgets, layout)
    given = {} if args.pair_layout is None else {"pair_layout": layout}  # every run's caches take it
    if args.smoke:  # one task of each kind, where the tasks have both
        generation = [t for t in tasks if (parse_task_name(t) or ("", "", False))[2]]
        tasks = [*[t for t in tasks if t not in generation][:1], *generation[:1]] if generation else tasks[:2]
        limit, args.runs = min(limit or 2, 2), ["PN-Mix @ 2.25", "KIVI @ 2.25"]
    if args.runs:
        unknown = sorted(set(args.runs) - {r.label for r in runs})
        if unknown:
            p.error(f"--runs: no run labelled {unknown}; the runs are {[r.label for r in runs]}")
    planned = runs  # the whole plan: what an extended result's runs are described and ordered by
    runs = [r for r in runs if r.role == "baseline" or not args.runs or r.label in args.runs]
    if args.earlier is not None:
        try:
            new = extension.missing(args.earlier, runs)
        except extension.ExtensionError as err:
            p.error(f"--extend {args.extend}: {err}")
        if not new:
            p.error(f"--extend {args.extend}: it holds every run asked for; nothing to add")
        runs = [runs[0], *new]  # FP16 again: its outcomes must be the earlier ones
    for r in runs:  # every run's model_args, before the weights load
        try:
            check({"pretrained": args.model, **r.model_kwargs(), **given})
        except ModelArgsError as err:
            p.error(f"run {r.label!r}: {err}")
    import torch

    torch.set_num_threads(args.threads or len(os.sched_getaffinity(0)))
    start = time.monotonic()
    base = PNMixLM(pretrained=args.model, method="FP16", **given)
    views = {r.label: PNMixLM(share=base, **{**r.model_kwargs(), **given}) for r in runs}
    loaded_code()  # the code as imported now: what the result records, whatever is edited while it runs
    # what decides the scores, recorded with the kept ones and checked by a resume (and by the report)
    earlier = [] if args.earlier is None else [r["method"] for r in args.earlier["runs"] if r.get("method")]
    behaviour = canaries.record(
        [*earlier, *(r.method for r in runs)],
        PIPELINE,
        model_fingerprint=source.fingerprint,
        data=task_paths(tasks).values(),
    )
    identity = {"model": source.fingerprint, **given, "lm_eval": __import__("lm_eval").__version__}
    # each process of a multi-process launch keeps its scores in a file of its own
    part = "" if base.world_size == 1 else f"-rank{base.rank}of{base.world_size}"
    made_in = computation(base.settings.dtype, base.device)  # pieces combine only where it is the same
    if args.earlier is not None:
        try:
            extension.check_same(
                args.earlier,
                fingerprint=source.fingerprint,
                files=task_files(tasks),
                limit=limit,
                layout=layout,
                lm_eval=identity["lm_eval"],
                made_in=made_in,
                pipeline=PIPELINE,
            )
        except extension.ExtensionError as err:
            p.error(f"--extend {args.extend}: {err}")
    try:
        scores = Scores(args.out, identity, behaviour, part, made_in=made_in)
    except KeptFileError as err:
        p.error(f"--out: {err}")
    if scores.read:
        print(f"{p.prog}: resuming: {scores.read} scores kept in {args.out} read back", file=sys.stderr)
    keys = {r.label: run_key(r.model_args()) for r in runs}
    shared = Shared(base, views, scores, keys)
    try:
        with interrupts.as_exceptions():
            results = evaluate(tasks, limit, manager, shared)
    except RequestTooLong as error:
        p.error(f"--tasks: {error}")
    except KeptFileError as error:  # a full disk: what was kept before it stays kept
        print(f"{p.prog}: error: {error}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, interrupts.Terminated) as stop:
        kept = sum(map(len, scores.kept.values()))
        where = f"kept in {args.out} ({scores.pattern}); the same command resumes from them"
        where = where if kept else "nothing was finished"
        print(f"{p.prog}: interrupted: {kept} scores {where}", file=sys.stderr)
        return 128 + getattr(stop, "signum", signal.SIGINT)
    if shared.reused or shared.partly:
        print(
            f"{p.prog}: {shared.reused} contexts' scores were all kept ones, {shared.partly} some runs' of them",
            file=sys.stderr,
        )
    base.barrier()
    try:
        contexts, seconds = scores.recorded() if base.rank == 0 else (0, 0.0)
    except KeptFileError as error:
        print(f"{p.prog}: error: {error}", file=sys.stderr)
        return 1
    base.barrier()  # rank 0 has read every process's file before any is removed
    if base.rank != 0:  # lm-eval gathered every document's outcome on rank 0, which writes the result
        scores.path.unlink(missing_ok=True)
        return 0
    first = results[runs[0].label]
    data = record(
        "task-accuracy",
        base.device,
        # a bfloat16 result on a GPU and a float32 one on the CPU are different computations: told apart by these
        dtype=made_in["dtype"],
        device_class=made_in["device"],
        model=source.describe(),
        model_fingerprint=source.fingerprint,
        head_dim=d,
        layers=quantized_layers(base.model.config),
        pair_layout=layout,
        limit=limit,
        tasks=[
            {"name": t, "items": len(first["samples"][t]), "chance": chance(first, t), "output": output_type(first, t)}
            for t in tasks
        ],
        processes=base.world_size,
        runs=[
            {**r.describe(), "results": {t: {"correct": outcomes(results[r.label], t)} for t in tasks}} for r in runs
        ],
        task_files=task_files(tasks),
        lm_eval_version=__import__("lm_eval").__version__,
        seconds=round(time.monotonic() - start, 1),
        # the contexts scored and their seconds, summed over processes and pieces (a resumed sweep's whole work)
        scored_contexts=contexts,
        scoring_seconds=round(seconds, 1),
        behaviour=behaviour,
    )
    if args.earlier is not None:
        differ = extension.fp16_differences(args.earlier, data["runs"][0])
        if differ:  # the new runs do not pair with the earlier ones: written alone, the scores kept
            write_result(p.prog, args.out, KIND, data)
            print(
                f"{p.prog}: error: --extend {args.extend}: FP16 answers otherwise than in it on {', '.join(differ)}: "
                "the runs do not pair item by item; written alone, not merged",
                file=sys.stderr,
            )
            return 1
        data = extension.merge(args.earlier, args.extend, data, planned)
    write_result(p.prog, args.out, KIND, data)
    scores.remove()  # the result holds them now
    return 0


def canary() -> dict:
    """The task-accuracy pipeline's canary (`benchmarks.canaries.behaviour`): the lm-eval model of
    `benchmarks.accuracy.lm_eval_model` with the FP16 method (the tool's own path: tokenising, shared contexts,
    scoring, greedy generation) on the tiny Llama saved with a character tokenizer, scoring fixed items and
    generating."""
    from lm_eval.api.instance import Instance

    from benchmarks.accuracy.lm_eval_model import PNMixLM  # deferred: lm-eval takes seconds to import

    # this process's own copy of the tiny model (every process of a launch runs its canaries), removed after
    with tempfile.TemporaryDirectory(prefix="pnmix-canary-") as folder:
        lm = PNMixLM(pretrained=str(pipelines.save_tiny(Path(folder))), method="FP16", chunk=4)
        items = enumerate(pipelines.ITEMS)
        scored = lm.loglikelihood(
            [Instance("loglikelihood", {}, item, i, metadata=("canary", i, 1)) for i, item in items],
            disable_tqdm=True,
        )
        generated = lm.generate_until(
            [Instance("generate_until", {}, pipelines.GENERATE, 0, metadata=("canary", 0, 1))], disable_tqdm=True
        )
    return outcome(
        {
            "greedy": [bool(g) for _, g in scored],
            "generated": generated,
            "chosen": max(range(2), key=lambda i: scored[i][0]),  # of the two answers to one context
        },
        {"loglikelihood": [float(s) for s, _ in scored]},
    )


#: The pipeline a task-accuracy result records, with its canary.
PIPELINE = {"task-accuracy": canary}


_TASK_RESULT = {"correct": schema.ListOf(schema.OneOf((0, 1)), nonempty=True)}  # true and false are 1 and 0
#: What a task-accuracy result holds, as its readers read it (`markdown`, the report): only the per-document
#: outcomes; every accuracy, interval and verdict is computed from them.
SCHEMA = {
    **schema.MEASUREMENT,
    "tasks": schema.ListOf(
        {"name": str, "items": schema.Range(1, 10**9, integer=True), "chance": schema.FRACTION}, nonempty=True
    ),
    "runs": schema.ListOf(
        {
            "label": str,
            "role": str,
            # what a reader pairs runs by (results of older code record model_args alone)
            "design?": schema.Maybe(schema.TEXT),
            "config?": schema.Maybe(schema.CONFIG_RECORD),
            "options?": {"*": (int, float, str, bool)},
            "key_bits?": schema.Maybe(schema.BITS),
            "value_bits?": schema.Maybe(schema.BITS),
            "budget?": schema.Maybe(schema.BITS),
            "paper_main?": bool,
            "results": {"*": _TASK_RESULT},
        },
        nonempty=True,
    ),
    # the earlier results an --extend merged in, oldest first (`benchmarks.accuracy.extension.merge`)
    "extends?": schema.ListOf(
        {
            "file": str,
            "digest": schema.Maybe(str),
            "command": str,
            "date_utc": str,
            "seconds": schema.Maybe(schema.Range(0, 10**9)),
            "runs": schema.ListOf(str, nonempty=True),
        }
    ),
}


def consistent(data: dict) -> list[tuple[str, str]]:
    """One FP16 baseline run, and every run with an outcome for each item of every task (runs are paired item
    by item)."""
    out = [] if any(r["role"] == "baseline" for r in data["runs"]) else [("runs", "has no run of role 'baseline'")]
    for i, run in enumerate(data["runs"]):
        for t in data["tasks"]:
            path = schema.key(f"runs[{i}].results", t["name"])
            if t["name"] not in run["results"]:
                out.append((path, "missing: every run has a result for every task of `tasks`"))
            elif len(run["results"][t["name"]]["correct"]) != t["items"]:
                out.append(
                    (
                        f"{path}.correct",
                        f"has {len(run['results'][t['name']]['correct'])} outcomes, "
                        f"expected the task's {t['items']} items",
                    )
                )
    return out


#: A task-accuracy result: its schema, its markdown, its canary and the check that its runs pair item by item.
KIND = schema.Kind("task-accuracy", SCHEMA, render=markdown, pipeline=PIPELINE, consistent=consistent)


if __name__ == "__main__":
    sys.exit(main())
