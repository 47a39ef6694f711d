"""The sweep's kept scores are checked, owned and bounded: a line edited or swapped is refused naming its file
and line, as is a value out of range or a file the sweep cannot read; one sweep at a time holds an --out; a
full disk says what is kept; and a piece of another dtype or kind of device is refused, saying why."""

import errno
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")

import torch

from benchmarks.accuracy import task_accuracy
from benchmarks.canaries import behaviour as canaries
from benchmarks.tests.test_task_accuracy import tiny_task

IDENTITY = {"model": "m"}
CPU = task_accuracy.computation(torch.float32, torch.device("cpu"))
CHOICE_A, CHOICE_B = ("ctx", " 4213"), ("ctx", " boats")
GENERATION = ("ctx", {"until": ["\n"], "max_gen_toks": 4})


@pytest.fixture(scope="module")
def behaviour():
    return canaries.record(pipeline=task_accuracy.PIPELINE)


def kept(folder, behaviour, made_in=CPU) -> task_accuracy.Scores:
    """A file of two contexts (lines 2-4: FP16's two candidates and 2.5 s; 5-6: a generation and 1.5 s)."""
    scores = task_accuracy.Scores(folder, IDENTITY, behaviour, made_in=made_in)
    scores.add([("FP16", CHOICE_A, (-1.0, True)), ("FP16", CHOICE_B, (-3.0, False))], 2.5)
    scores.add([("FP16", GENERATION, " 4213.")], 1.5)
    return scores


def rewrite(path, n: int, edit) -> None:
    """Line `n` (from 1) of a kept file, as JSON, passed through `edit`; the others as they are."""
    lines = path.read_text().splitlines()
    lines[n - 1] = json.dumps(edit(json.loads(lines[n - 1])))
    path.write_text("\n".join(lines) + "\n")


def refused(folder, behaviour, made_in=CPU) -> str:
    with pytest.raises(task_accuracy.KeptFileError) as error:
        task_accuracy.Scores(folder, IDENTITY, behaviour, made_in=made_in)
    said = str(error.value)
    assert "\n" not in said  # one line
    return said


def test_kept_scores_read_back_with_their_seconds(tmp_path, behaviour):
    scores = kept(tmp_path, behaviour)
    again = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU)
    assert again.read == 3 and again.get("FP16", CHOICE_B) == (-3.0, False) and again.get("FP16", GENERATION)
    assert again.recorded() == (2, 4.0) == (2, scores.seconds)


def test_two_scores_swapped_are_refused_naming_the_file_and_line(tmp_path, behaviour):
    """The tester's case: FP16's two scores of one context swapped, each line valid JSON; resumed, FP16's first
    outcome would have flipped."""
    path = kept(tmp_path, behaviour).path
    lines = path.read_text().splitlines()
    a, b = json.loads(lines[1]), json.loads(lines[2])
    a[2], b[2] = b[2], a[2]
    path.write_text("\n".join([lines[0], json.dumps(a), json.dumps(b), *lines[3:]]) + "\n")
    said = refused(tmp_path, behaviour)
    assert said.startswith(f"{path} line 2: its digest is not that of its run, request and score")


def test_a_line_moved_from_another_sweeps_file_is_refused(tmp_path, behaviour):
    """The digest covers the file's header: a valid line of another sweep (here another model) does not pass."""
    other = task_accuracy.Scores(tmp_path / "other", {"model": "n"}, behaviour, made_in=CPU)
    other.add([("FP16", CHOICE_A, (-0.5, True))], 1.0)
    path = kept(tmp_path, behaviour).path
    moved = other.path.read_text().splitlines()[1]
    path.write_text(path.read_text() + moved + "\n")
    assert refused(tmp_path, behaviour).startswith(f"{path} line 7: its digest")


@pytest.mark.parametrize(
    ("line", "edit", "says"),
    [
        (2, lambda r: [r[0], r[1], ["-1.0", True], r[3]], 'log-likelihood "-1.0": expected a finite number <= 0'),
        (2, lambda r: [r[0], r[1], None, r[3]], "score null: expected [log-likelihood, greedy] or the text"),
        (2, lambda r: [r[0], r[1], [float("nan"), True], r[3]], "log-likelihood NaN: expected a finite number"),
        (2, lambda r: [r[0], r[1], [0.5, True], r[3]], "log-likelihood 0.5: expected a finite number <= 0"),
        (3, lambda r: [r[0], r[1], [-3.0, 1], r[3]], "greedy 1: expected true or false"),
        (4, lambda r: [r[0], r[1], 1e308, r[3]], "seconds 1e+308: expected a context's time, 0 to 604800"),
        (4, lambda r: [r[0], r[1], -2.5, r[3]], "seconds -2.5: expected a context's time"),
        (4, lambda r: [r[0], r[1], "2.5", r[3]], 'seconds "2.5": expected a context\'s time'),
        (2, lambda r: r[:3], "no digest (kept by an earlier version of the sweep)"),
        (2, lambda r: r[:2], "expected [run, request, score, digest]"),
        (2, lambda r: {"run": r[0]}, "expected [run, request, score, digest]"),
        (1, lambda h: {"behaviour": h["behaviour"]}, "not a kept-scores header"),
        (1, lambda h: {k: v for k, v in h.items() if k != "computation"}, "records no dtype and device"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_file_and_line(tmp_path, behaviour, line, edit, says):
    path = kept(tmp_path, behaviour).path
    rewrite(path, line, edit)
    said = refused(tmp_path, behaviour)
    assert said.startswith(f"{path} line {line}: ") and says in said


def test_a_line_that_is_not_json_is_refused_unless_it_is_the_last_one_cut_short(tmp_path, behaviour):
    path = kept(tmp_path, behaviour).path
    with open(path, "a") as f:
        f.write('["FP16", "cut sho')  # a kill mid-line: not read, and dropped before this process appends
    again = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU)
    assert again.read == 3
    again.add([("KIVI", CHOICE_A, (-2.0, False))], 1.0)
    assert task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU).read == 4
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:2], "[1, 2", *lines[2:]]) + "\n")
    said = refused(tmp_path, behaviour)
    assert said.startswith(f"{path} line 3: not JSON")


def test_bytes_that_are_not_text_are_refused_naming_the_line(tmp_path, behaviour):
    path = kept(tmp_path, behaviour).path
    path.write_bytes(path.read_bytes() + b"\xff\xfe\n")
    assert refused(tmp_path, behaviour) == f"{path} line 7: not UTF-8 text; remove the file to start over"


def test_a_folder_where_the_file_should_be_is_refused(tmp_path, behaviour):
    path = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU).path
    path.mkdir()
    assert refused(tmp_path, behaviour) == f"{path}: a folder where the sweep keeps a file of scores; remove it"


def test_an_empty_file_holds_nothing_and_takes_the_header_on_its_first_context(tmp_path, behaviour):
    """A sweep killed as it began its file (or a full disk then) leaves it empty: not another sweep's."""
    path = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU).path
    path.write_text("")
    scores = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU)
    assert scores.read == 0
    scores.add([("FP16", CHOICE_A, (-1.0, True))], 1.0)
    again = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU)
    assert again.get("FP16", CHOICE_A) == (-1.0, True)
    path.write_text('{"identity": {"mod')  # its header cut short: nothing kept either
    assert task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU).read == 0


def test_a_score_out_of_range_is_not_written(tmp_path, behaviour):
    scores = task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=CPU)
    with pytest.raises(ValueError, match=r"run FP16: log-likelihood NaN: expected a finite number <= 0: not kept"):
        scores.add([("FP16", CHOICE_A, (float("nan"), True))], 1.0)
    assert not scores.path.exists()


class Full:
    """A file on a full disk."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_says_what_is_kept(tmp_path, behaviour, monkeypatch):
    scores = kept(tmp_path, behaviour)
    monkeypatch.setattr(task_accuracy, "open", Full, raising=False)
    with pytest.raises(task_accuracy.KeptFileError) as error:
        scores.add([("KIVI", CHOICE_A, (-2.0, False))], 1.0)
    said = str(error.value)
    assert said == (
        f"{scores.path}: this context's scores cannot be kept (No space left on device); the 3 scores kept before "
        f"it are in {tmp_path}, and the same command resumes from them once it can write there"
    )


def test_a_piece_of_another_dtype_or_device_is_refused_saying_why(tmp_path, behaviour):
    """A bfloat16 piece made on a GPU (the pnmix model's CUDA default) and a float32 resume on the CPU are
    different computations: refused with that reason, not as code that computes otherwise."""
    gpu = task_accuracy.computation(torch.bfloat16, torch.device("cuda", 0))
    assert gpu == {"dtype": "bfloat16", "device": "cuda"}
    path = kept(tmp_path, behaviour, made_in=gpu).path
    said = refused(tmp_path, behaviour)
    assert said.startswith(f"{path} line 1: scores computed in bfloat16 on cuda, this sweep computes in float32 on cpu")
    assert "a different computation" in said and "resume it with the same dtype on the same kind of device" in said
    assert task_accuracy.Scores(tmp_path, IDENTITY, behaviour, made_in=gpu).read == 3  # the same computation
    # the header's dtype edited to pass: every line's digest covers the header
    rewrite(path, 1, lambda h: {**h, "computation": CPU})
    assert refused(tmp_path, behaviour).startswith(f"{path} line 2: its digest")


def test_one_sweep_at_a_time_holds_an_out(tmp_path):
    with task_accuracy.sweep_lock(tmp_path) as stale:
        assert stale is None
        holder = json.loads((tmp_path / task_accuracy.LOCK).read_text())
        assert holder["pid"] > 0 and holder["command"]
        with pytest.raises(task_accuracy.KeptFileError) as error:
            with task_accuracy.sweep_lock(tmp_path):
                pytest.fail("a second holder")
        said = str(error.value)
        assert said.startswith(f"{tmp_path}: another sweep writes there (pid {holder['pid']} on {holder['host']}")
        assert said.endswith("wait for it to end, or give another --out") and "\n" not in said
    assert not (tmp_path / task_accuracy.LOCK).exists()  # released
    with task_accuracy.sweep_lock(tmp_path):  # and taken again
        pass


def test_a_stale_lock_is_named_and_taken_over(tmp_path):
    """A sweep killed (SIGKILL) leaves its lock file; the system dropped its lock with the process."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(gone.stdout)
    record = {"pid": pid, "host": "h", "started_utc": "2026-12-01T00:00:00+00:00", "command": "sweep"}
    (tmp_path / task_accuracy.LOCK).write_text(json.dumps(record))
    with task_accuracy.sweep_lock(tmp_path) as stale:
        assert stale == f"pid {pid} on h, since 2026-12-01T00:00:00+00:00: `sweep`"
        assert json.loads((tmp_path / task_accuracy.LOCK).read_text())["pid"] != pid


def test_a_lock_that_cannot_be_made_is_refused_naming_it(tmp_path):
    (tmp_path / task_accuracy.LOCK).mkdir()
    with pytest.raises(task_accuracy.KeptFileError, match=r"\.task-accuracy\.lock: cannot be opened as the sweep's"):
        with task_accuracy.sweep_lock(tmp_path):
            pass


def test_a_second_sweep_into_the_same_out_is_refused_before_the_model_loads(tiny, tmp_path, capsys, monkeypatch):
    """Two sweeps into one --out: the first to finish would remove the other's kept scores."""
    monkeypatch.setattr(task_accuracy, "task_index", lambda *a: pytest.fail("refused before any work"))
    tiny_task(tmp_path)
    argv = ["--model", str(tiny), "--include-path", str(tmp_path), "--tasks", "tinytask_mc", "--out", str(tmp_path)]
    with task_accuracy.sweep_lock(tmp_path):
        with pytest.raises(SystemExit) as exit_:
            task_accuracy.main(argv)
    said = capsys.readouterr().err.strip().splitlines()[-1]  # after argparse's usage
    assert exit_.value.code == 2 and f"(pid {os.getpid()} on " in said
    assert said.startswith(f"pnmix-task-accuracy: error: --out: {tmp_path}: another sweep writes")


def interrupted_after_first_context(monkeypatch):
    """score_shared as it is, until the third run's call (the second context): a kill there."""
    from benchmarks.accuracy.lm_eval_model import PNMixLM  # deferred: lm-eval takes seconds to import

    score_shared, calls = PNMixLM.score_shared, []

    def interrupted(self, *args, **kwargs):
        calls.append(self)
        if len(calls) > 2:
            raise KeyboardInterrupt
        return score_shared(self, *args, **kwargs)

    monkeypatch.setattr(PNMixLM, "score_shared", interrupted)
    return lambda: monkeypatch.setattr(PNMixLM, "score_shared", score_shared)


@pytest.mark.slow
def test_a_resume_from_swapped_scores_ends_in_one_line_naming_the_file_and_line(tiny, tmp_path, monkeypatch, capsys):
    """The tester's run: FP16's two scores of the first context swapped in the kept file; the rerun exited 0
    with FP16's first outcome flipped."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path, distinct=True)
    argv = ["--model", str(tiny), "--tasks", "tinytask_mc", "--include-path", str(tmp_path), "--threads", "1"]
    argv += ["--out", str(tmp_path / "out"), "--runs", "Kitty"]
    restore = interrupted_after_first_context(monkeypatch)
    assert task_accuracy.main(argv) == 130
    restore()
    (path,) = (tmp_path / "out").glob(".task-accuracy-*.scores.jsonl")
    lines = path.read_text().splitlines()
    a, b = json.loads(lines[1]), json.loads(lines[2])  # FP16's two candidates
    a[2], b[2] = b[2], a[2]
    path.write_text("\n".join([lines[0], json.dumps(a), json.dumps(b), *lines[3:]]) + "\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        task_accuracy.main(argv)
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and said.startswith(f"pnmix-task-accuracy: error: --out: {path} line 2")
    assert not list((tmp_path / "out").glob("task-accuracy-*.json"))


@pytest.mark.slow
def test_a_full_disk_while_sweeping_ends_in_one_line_saying_what_is_kept(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tiny_task(tmp_path, distinct=True)
    argv = ["--model", str(tiny), "--tasks", "tinytask_mc", "--include-path", str(tmp_path), "--threads", "1"]
    argv += ["--out", str(tmp_path), "--runs", "Kitty"]
    appends = []

    def full_after_one(*args, **kwargs):  # the first context kept, then the disk is full
        appends.append(args)
        return open(*args, **kwargs) if len(appends) == 1 else Full()

    monkeypatch.setattr(task_accuracy, "open", full_after_one, raising=False)
    assert task_accuracy.main(argv) == 1
    said = capsys.readouterr().err.strip().splitlines()[-1]
    (path,) = tmp_path.glob(".task-accuracy-*.scores.jsonl")
    assert said == (
        f"pnmix-task-accuracy: error: {path}: this context's scores cannot be kept (No space left on "
        f"device); the 4 scores kept before it are in {tmp_path}, and the same command resumes from them once it "
        "can write there"
    )
    assert not list(tmp_path.glob("task-accuracy-*.json"))
