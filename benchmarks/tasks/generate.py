"""Write the task suite: one JSONL per (task, length) and the lm-eval configs (see `benchmarks.tasks`).

    python -m benchmarks.tasks.generate [--out DIR] [--tasks T ...] [--items N] [--lengths L ...] [--seed S]
                                        [--model M] [--force]

`--out` (default: this package's folder) receives `data/<task>_<label>.jsonl.gz` and `configs/` (the
YAML of every task and group, and the loader they name). The gzip stream carries no time stamp; its
bytes may still differ between zlib builds, so reproducibility is of the decompressed text. Existing
files are left alone (the command refuses before writing anything) unless `--force`. Lengths are
counted with `--model`'s tokenizer (default SmolLM2-135M's; no weights are loaded).

Doc i of (task, length) is drawn from `random.Random("pnmix-tasks/<seed>/<task>/<length>/<i>")`
alone. A builder draws everything that does not depend on the haystack's size first, then renders
the document for a given number of haystack units (and, for long-output tasks, of passage items);
`fit` finds the largest size whose context stays within the target.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.commands.preflight import for_command
from benchmarks.models.source import DEFAULT
from benchmarks.tasks import (
    BY_NAME,
    DECODE_MARK,
    GEN_TOKENS,
    GEN_UNTIL,
    ITEMS,
    LENGTHS,
    MIN_LENGTH,
    PACKAGE,
    SEED,
    TASK_NAMES,
    TEXT_CORPUS,
    data_file,
    group_name,
    length_label,
    task_name,
)
from reference.cli import positive_int
from reference.records import write_atomic, write_bytes_atomic

NOISE = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
ADJECTIVES = (
    "ancient brave bright calm clever crimson curious distant eager fancy gentle golden hidden humble jolly lively "
    "lucky misty modern noble patient polite proud rapid rustic silent silver simple sleepy smooth steady swift "
    "tender tidy vivid wild witty frozen hollow velvet"
).split()
NOUNS = (
    "harbor orchid meadow lantern falcon river canyon piano garden compass window castle rocket island basket forest "
    "pencil mirror ladder bridge candle comet desert engine feather glacier hammer helmet jacket kettle marble "
    "needle violin pepper planet puzzle saddle tunnel wagon whistle"
).split()
#: The lo_registry names: animals that are one token after a space in SmolLM2's vocabulary, so that no name
#: is another's first token ("ant" of "anteater" and "antelope" made the model answer the wrong entry).
ANIMALS = (
    "alligator ape bat bear beaver bee bison boar buffalo bull butterfly camel caribou cat chicken chimpanzee cow "
    "crab crane cricket crocodile crow deer dog dolphin donkey dove duck eagle eel elephant elk falcon fox frog "
    "giraffe goat goose gorilla hare hawk hen horse jellyfish kangaroo lamb leopard lion lizard lobster mole monkey "
    "moose mosquito moth mouse mule octopus owl ox panda parrot penguin pig pigeon pony rabbit ram rat reindeer "
    "rhino salmon seal shark sheep shrimp snail sparrow spider squid squirrel swallow tiger toad tortoise trout tuna "
    "turkey turtle wasp whale wolf zebra"
).split()
COLOURS = "red blue green yellow purple orange white black brown pink grey".split()
#: The cwe words: common English nouns, each one token after a space in SmolLM2's vocabulary (so that
#: candidates differ in frequency, not in length).
WORDS = (
    "anchor apple barrel basket blanket bottle bridge button candle carpet castle chair circle cloud copper cotton "
    "desert dinner doctor dragon engine farmer feather finger flower forest frame garden glass gold grape guitar "
    "hammer harbor helmet honey horse insect iron island jacket jungle kettle king knife ladder lamp lantern leaf "
    "lemon letter lion machine marble market meadow metal milk mirror monkey moon mountain music needle nest "
    "nickel night number ocean office onion orange oven palace paper parrot pencil pepper piano pillow pirate "
    "planet pocket potato prince puzzle queen rabbit radio rain ribbon ring river robot rocket rope saddle salad "
    "sand school shadow shell ship shirt shoe silver sister snake snow soap sock soup spider spoon star stone storm "
    "street sugar summer sword table teacher temple tent thread ticket tiger tomato tower train tree truck tunnel "
    "valley velvet village violin wagon wallet water wheel whistle wind window winter wolf wood yard zebra"
).split()

NIAH_INTRO = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the numbers afterwards.\n\n"
)
DOC_INTRO = "Here is an excerpt of the Python documentation.\n\n"
#: Share of a cwe list taken by each of its three common words; the other words share the rest evenly.
#: SmolLM2-135M ranks a word by its frequency in the context only when the gap is wide (0.05, with rare
#: words seen 1-3 times, left it near chance at 1K tokens).
CWE_COMMON_SHARE = 0.1
#: Share of a lo_count passage taken by its most frequent colour (the others share the rest at random).
COUNT_TOP_SHARE = 0.6


def passage_budget(length: int) -> int:
    """Tokens after DECODE_MARK in a long-output task (passage and question): a quarter of the length,
    300 to 1500."""
    return min(1500, max(300, length // 4))


# -- the sources -----------------------------------------------------------------------------------


def stdlib_corpus() -> str:
    """The Python documentation's topic help of the running Python (`pydoc_data.topics`), as one text."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name].strip("\n") for name in sorted(topics))
    text = "\n".join(line.rstrip() for line in text.splitlines())
    return re.sub(r"\n{3,}", "\n\n", text).replace(DECODE_MARK, "") + "\n"


def corpus_text(path: Path = TEXT_CORPUS) -> str:
    """The shipped natural-text haystack; made from this Python's stdlib (and saved) if missing."""
    if not path.exists():
        write_atomic(path, stdlib_corpus())
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class Sources:
    encode: Callable[[str], list[int]]  # token ids of a text (no special tokens)
    lines: tuple[str, ...]  # the natural-text haystack, by line

    def count(self, text: str) -> int:
        return len(self.encode(text))


def sources(tokenizer) -> Sources:
    text = corpus_text()
    return Sources(lambda s: tokenizer(s, add_special_tokens=False)["input_ids"], tuple(text.splitlines()))


# -- building blocks -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parts:
    prompt: str
    decode: str
    choices: list[str]
    gold: int
    depth: list[float]


def place(units: list[str], needles: list[str], depths: list[float]) -> list[str]:
    """`units` with each needle inserted at its depth (a fraction of the units before it); needles at one
    place keep their order (a chain of assignments must)."""
    out = list(units)
    for i in reversed(sorted(range(len(needles)), key=lambda i: depths[i])):  # deepest first: places stay valid
        out.insert(round(depths[i] * len(units)), needles[i])
    return out


def noise(n: int) -> list[str]:
    return [NOISE[j % len(NOISE)] for j in range(n)]


def text_window(src: Sources, start: int, n: int) -> str:
    return "\n".join(src.lines[(start + j) % len(src.lines)] for j in range(n))


def numbers(rng: random.Random, digits: int, k: int, exclude=()) -> list[int]:
    """k distinct numbers of `digits` digits, none in `exclude`."""
    out, seen = [], set(exclude)
    while len(out) < k:
        x = rng.randrange(10 ** (digits - 1), 10**digits)
        if x not in seen:
            out.append(x)
            seen.add(x)
    return out


def near_misses(rng: random.Random, x: int, k: int) -> list[int]:
    """k distinct numbers that differ from x in exactly one digit (the first digit stays non-zero)."""
    digits, out = str(x), []
    while len(out) < k:
        i = rng.randrange(len(digits))
        d = rng.choice([c for c in "0123456789" if c != digits[i] and (i or c != "0")])
        y = int(digits[:i] + d + digits[i + 1 :])
        if y not in out:
            out.append(y)
    return out


def keys(rng: random.Random, k: int) -> list[str]:
    """k distinct needle keys such as "quiet-harbor"."""
    pairs = rng.sample([(a, n) for a in ADJECTIVES for n in NOUNS], k)
    return [f"{a}-{n}" for a, n in pairs]


def shuffled(rng: random.Random, gold, distractors) -> tuple[list[str], int]:
    """(choices, index of gold): each choice is " " + the answer, in random order."""
    order = [gold, *distractors]
    rng.shuffle(order)
    return [f" {x}" for x in order], order.index(gold)


def depths(rng: random.Random, k: int) -> list[float]:
    return [round(rng.random(), 4) for _ in range(k)]


# -- the tasks -------------------------------------------------------------------------------------
# A builder takes (rng, n haystack units, m passage items, sources) and draws the size-independent
# content first, so that every size shares it.


def build_passkey(rng, n, m, src) -> Parts:
    key = rng.randrange(10000, 100000)
    near = near_misses(rng, key, 2)
    choices, gold = shuffled(rng, key, near + numbers(rng, 5, 3, exclude=[key, *near]))
    depth = depths(rng, 1)
    needle = f"The pass key is {key}. Remember it. {key} is the pass key."
    prompt = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.\n\n" + " ".join(place(noise(n), [needle], depth))
    )
    return Parts(prompt + "\n", "What is the pass key? The pass key is", choices, gold, depth)


def magic(key: str, value: int) -> str:
    return f"One of the special magic numbers for {key} is: {value}."


def niah_question(key: str, restate: bool = False) -> str:
    """RULER's question; restate=True ends it with the needle's own words up to the number: where several
    needles hold numbers, SmolLM2-135M tied the key to its number only so (near chance at 1K tokens with
    RULER's ending)."""
    answer = (
        f"One of the special magic numbers for {key} is:"
        if restate
        else f"The special magic number for {key} mentioned in the provided text is"
    )
    return f"What is the special magic number for {key} mentioned in the provided text? {answer}"


def _niah_single(rng, n, src, haystack: str) -> Parts:
    (key,) = keys(rng, 1)
    value, *others = numbers(rng, 7, 5)
    choices, gold = shuffled(rng, value, others)
    depth = depths(rng, 1)
    if haystack == "noise":
        body = " ".join(place(noise(n), [magic(key, value)], depth))
    else:
        start = rng.randrange(len(src.lines))
        body = "\n".join(place(text_window(src, start, n).split("\n"), [magic(key, value)], depth))
    return Parts(NIAH_INTRO + body + "\n", niah_question(key), choices, gold, depth)


def build_niah_single(rng, n, m, src) -> Parts:
    return _niah_single(rng, n, src, "noise")


def build_niah_text(rng, n, m, src) -> Parts:
    return _niah_single(rng, n, src, "text")


def build_niah_multikey(rng, n, m, src) -> Parts:
    names = keys(rng, 4)
    values = numbers(rng, 7, 4)
    asked = rng.randrange(4)
    choices, gold = shuffled(rng, values[asked], values[:asked] + values[asked + 1 :])
    depth = depths(rng, 4)
    body = " ".join(place(noise(n), [magic(k, v) for k, v in zip(names, values, strict=True)], depth))
    return Parts(NIAH_INTRO + body + "\n", niah_question(names[asked], restate=True), choices, gold, depth)


def build_multivalue(rng, n, m, src) -> Parts:
    # RULER's niah_multivalue: one key, four numbers. With three more keys of one number each as the
    # distractors, SmolLM2-135M was near chance at 1K tokens (it spreads the key's probability over its four
    # numbers, and binds keys to numbers loosely); the distractors are numbers the text does not hold.
    (key,) = keys(rng, 1)
    values = numbers(rng, 7, 7)
    mine, others = values[:4], values[4:]
    choices, gold = shuffled(rng, rng.choice(mine), others)
    depth = depths(rng, 4)
    question = (
        f"What are all the special magic numbers for {key} mentioned in the provided text? "
        f"One of the special magic numbers for {key} is:"
    )
    body = " ".join(place(noise(n), [magic(key, v) for v in mine], depth))
    return Parts(NIAH_INTRO + body + "\n", question, choices, gold, depth)


VAR_CHAINS, VAR_HOPS = 3, 4


def build_vartrack(rng, n, m, src) -> Parts:
    names = set()
    while len(names) < VAR_CHAINS * VAR_HOPS:
        names.add("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))
    names = rng.sample(sorted(names), len(names))
    chains = [names[c * VAR_HOPS : (c + 1) * VAR_HOPS] for c in range(VAR_CHAINS)]
    values = numbers(rng, 5, VAR_CHAINS)
    # "QPX = 41926": the root of the asked chain, against other chains' variables given the same value. RULER
    # asks for every variable of the chain; SmolLM2-135M ranked a chain's names near chance (0 of 2 at 1K
    # tokens), while a candidate that restates an assignment it can find is ranked by the assignment.
    others = rng.sample([v for c in chains[1:] for v in c], 4)
    choices, gold = shuffled(rng, f"{chains[0][0]} = {values[0]}", [f"{v} = {values[0]}" for v in others])
    # each chain's assignments in order, the chains interleaved at random
    order = [c for c in range(VAR_CHAINS) for _ in range(VAR_HOPS)]
    rng.shuffle(order)
    depth = sorted(depths(rng, len(order)))
    hop = [0] * VAR_CHAINS
    statements = []
    for c in order:
        h = hop[c]
        source = str(values[c]) if h == 0 else f"VAR {chains[c][h - 1]}"
        statements.append(f"VAR {chains[c][h]} = {source}.")
        hop[c] += 1
    prompt = (
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        + " ".join(place(noise(n), statements, depth))
        + "\n"
    )
    question = f"Question: Which variable is assigned the value {values[0]} directly in the text above? Answer: VAR"
    return Parts(prompt, question, choices, gold, depth)


def build_cwe(rng, n, m, src) -> Parts:
    words = rng.sample(WORDS, len(WORDS))
    common, rare = words[:3], words[3:]  # the candidates' rare words first: they appear even in short lists
    choices, gold = shuffled(rng, rng.choice(common), rare[:4])
    each = max(6, round(CWE_COMMON_SHARE * n))
    items = [w for w in common for _ in range(each)]
    items += [rare[j % len(rare)] for j in range(max(0, n - len(items)))]
    rng.shuffle(items)
    prompt = (
        "Below is a list of words. Some of them appear more often than the others. "
        "Memorize the ones that appear most often.\n\n" + ", ".join(items) + "\n"
    )
    question = (
        "Question: What are the three most common words in the list above? "
        "Answer: One of the three most common words in the list above is"
    )
    return Parts(prompt, question, choices, gold, [])


def _document(src: Sources, start: int, n: int, instruction: str) -> str:
    return DOC_INTRO + text_window(src, start, n) + f"\n\nInstruction: {instruction}\n"


def _early(rng, m: int) -> int:
    """An item of the first quarter of a passage of m items."""
    return rng.randrange(max(1, m // 4))


def build_lo_registry(rng, n, m, src) -> Parts:
    start = rng.randrange(len(src.lines))
    animals = rng.sample(ANIMALS, m)
    codes = numbers(rng, 4, m)
    k = _early(rng, m)
    choices, gold = shuffled(rng, codes[k], rng.sample(codes[:k] + codes[k + 1 :], 4))
    pairs = zip(animals, codes, strict=True)
    entries = "".join(f"Entry {i + 1}: the code for {a} is {c}.\n" for i, (a, c) in enumerate(pairs))
    decode = (
        f"Registry:\n{entries}\nQuestion: In the registry above, what is the code for {animals[k]}?\n"
        f"Answer: The code for {animals[k]} is"
    )
    instruction = f"Write a registry that gives each of {m} animals a four-digit code, one numbered entry per line."
    return Parts(_document(src, start, n, instruction), decode, choices, gold, [round(k / m, 4)])


def build_lo_arith(rng, n, m, src) -> Parts:
    start = rng.randrange(len(src.lines))
    total = rng.randrange(10, 100)
    addends = [rng.randint(2, 19) for _ in range(m)]
    k = _early(rng, m)
    steps, totals = [], []
    for i, a in enumerate(addends):
        steps.append(f"Step {i + 1}: {total} + {a} = {total + a}.\n")
        total += a
        totals.append(total)
    nearby = sorted((i for i in range(m) if i != k), key=lambda i: (abs(i - k), i))[:4]
    choices, gold = shuffled(rng, totals[k], [totals[i] for i in nearby])
    # the answer restates the step up to its total: "after step 3" alone matched "Step 13:" as well
    decode = (
        "Working:\n" + "".join(steps) + f"\nQuestion: What was the running total after step {k + 1}?\n"
        f"Answer: Step {k + 1}: {totals[k] - addends[k]} + {addends[k]} ="
    )
    first = totals[0] - addends[0]
    instruction = (
        f"Start from {first}. Add the following {m} numbers one at a time and write the running total after "
        f"each step: {', '.join(map(str, addends))}."
    )
    return Parts(_document(src, start, n, instruction), decode, choices, gold, [round(k / m, 4)])


def build_lo_count(rng, n, m, src) -> Parts:
    start = rng.randrange(len(src.lines))
    top, *rest = rng.sample(COLOURS, len(COLOURS))
    choices, gold = shuffled(rng, top, rest[:3])
    top_count = round(COUNT_TOP_SHARE * m)
    colours = [top] * top_count + [rng.choice(rest) for _ in range(m - top_count)]
    rng.shuffle(colours)
    # The answer restates the list's header, so that the model's estimate of the list's next colour (its
    # in-context frequency) picks the candidate: asked "the colour that appears most often is", SmolLM2-135M's
    # prior for some colours outweighed even a 50% share (near chance at 1K tokens).
    decode = (
        "Colours: " + ", ".join(colours) + ".\n\nQuestion: Which colour appears most often in the list above?\n"
        "Answer: Colours:"
    )
    instruction = f"List {m} colours, separated by commas."
    return Parts(_document(src, start, n, instruction), decode, choices, gold, [])


BUILDERS = {name: globals()[f"build_{name}"] for name in TASK_NAMES}
#: The most passage items a long-output task can draw.
MAX_ITEMS = {"lo_registry": len(ANIMALS)}


# -- sizes -----------------------------------------------------------------------------------------


def fit(measure: Callable[[int], int], target: int, lo: int, hi: int) -> int:
    """The largest n in [lo, hi] with measure(n) <= target, for a measure that grows with n, nearly
    linearly (a secant guess, then regula falsi with bisection when it stalls)."""
    fa = measure(lo)
    if fa > target:
        raise ValueError(f"the smallest document has {fa} tokens, over the target {target}")
    a, b = lo, min(hi, lo + 16)
    fb = measure(b)
    while fb <= target:  # bracket the target
        if b == hi:
            return hi
        rate = (fb - fa) / (b - a)
        reach = 8 * (b - lo)  # a flat start (a minimum list size) says little about the rate: grow, don't leap
        step = reach if rate <= 0 else min(reach, round((target - fb) / rate * 1.02) + 1)
        a, fa = b, fb
        b = min(hi, a + max(1, step))
        fb = measure(b)
    bisect = False
    while b - a > 1:
        if bisect:
            guess = (a + b) // 2
        else:
            guess = min(max(a + (target - fa) * (b - a) // (fb - fa), a + 1), b - 1)
        width = b - a
        fg = measure(guess)
        if fg <= target:
            a, fa = guess, fg
        else:
            b, fb = guess, fg
        bisect = 2 * (b - a) > width
    return a


def make_doc(task: str, length: int, seed: int, index: int, src: Sources) -> dict:
    """Document `index` of (task, length): its context within `length` tokens, choices, gold, metadata."""
    build = BUILDERS[task]
    key = f"pnmix-tasks/{seed}/{task}/{length}/{index}"

    def render(n: int, m: int) -> Parts:
        return build(random.Random(key), n, m, src)

    m = 0
    if BY_NAME[task].long_output:
        m = fit(lambda m: src.count(render(0, m).decode), passage_budget(length), 8, MAX_ITEMS.get(task, 10**5))
    n = fit(lambda n: src.count(_joined(render(n, m))), length, 0, 10**6)
    parts = render(n, m)
    ids = src.encode(_joined(parts))
    prompt = common_prefix(src.encode(parts.prompt), ids)
    return {
        "context": parts.prompt + DECODE_MARK + parts.decode,
        "choices": parts.choices,
        "gold": parts.gold,
        "task": task,
        "length": length,
        "seed": seed,
        "index": index,
        "context_tokens": len(ids),
        "decode_tokens": len(ids) - prompt,
        "depth": parts.depth,
    }


def _joined(parts: Parts) -> str:
    return parts.prompt + parts.decode


def common_prefix(prompt: list[int], context: list[int]) -> int:
    """Tokens of the context that are the prompt's: up to where the prompt's own tokens stop being a prefix
    (as a model splits a marked context)."""
    return next(
        (i for i, (a, b) in enumerate(zip(prompt, context, strict=False)) if a != b), min(len(prompt), len(context))
    )


def doc_line(doc: dict) -> str:
    return json.dumps(doc, ensure_ascii=False) + "\n"


# -- configs ---------------------------------------------------------------------------------------

TEMPLATE = "_pnmix_template.yaml"
GEN_TEMPLATE = "_pnmix_gen_template.yaml"
LOADER = PACKAGE / "configs" / "utils.py"
#: Each template's output and metric (`benchmarks.tasks`: choosing among candidates, producing the answer).
CHOICE = ("multiple_choice", "acc")
GENERATION = ("generate_until", "exact")


def template_yaml() -> str:
    return (
        "# Shared by every pnmix_* multiple-choice task (written by python -m benchmarks.tasks.generate).\n"
        "custom_dataset: !function utils.load_docs\n"
        f"output_type: {CHOICE[0]}\n"
        "test_split: test\n"
        "doc_to_text: context\n"
        "doc_to_choice: choices\n"
        "doc_to_target: gold\n"
        'target_delimiter: ""\n'
        "metric_list:\n"
        f"  - metric: {CHOICE[1]}\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
        "metadata:\n"
        "  version: 1.0\n"
    )


def gen_template_yaml() -> str:
    until = ", ".join(json.dumps(u) for u in GEN_UNTIL)
    return (
        "# Shared by every pnmix_*_gen_* task: the answer produced greedily, compared exactly with the gold\n"
        "# candidate (written by python -m benchmarks.tasks.generate).\n"
        "custom_dataset: !function utils.load_docs\n"
        f"output_type: {GENERATION[0]}\n"
        "test_split: test\n"
        "doc_to_text: context\n"
        'doc_to_target: "{{choices[gold]}}"\n'
        "generation_kwargs:\n"
        f"  until: [{until}]\n"
        f"  max_gen_toks: {GEN_TOKENS}\n"
        "  do_sample: false\n"
        "process_results: !function utils.score_generation\n"
        "metric_list:\n"
        f"  - metric: {GENERATION[1]}\n"
        "    aggregation: mean\n"
        "    higher_is_better: true\n"
        "metadata:\n"
        "  version: 1.0\n"
    )


def task_yaml(task: str, length: int, generation: bool = False) -> str:
    return (
        f"include: {GEN_TEMPLATE if generation else TEMPLATE}\n"
        f"task: {task_name(task, length, generation)}\n"
        "dataset_kwargs:\n"
        f"  data_file: {data_file(task, length)}\n"
    )


def group_yaml(name: str, members: list[str], metric: str = CHOICE[1]) -> str:
    listed = "".join(f"  - {m}\n" for m in members)
    return (
        f"group: {name}\n"
        f"task:\n{listed}"
        "aggregate_metric_list:\n"
        f"  - metric: {metric}\n"
        "    aggregation: mean\n"
        "    weight_by_size: false\n"
        "metadata:\n"
        "  version: 1.0\n"
    )


def config_files(tasks: list[str], lengths: list[int]) -> dict[str, str]:
    """Name -> text of every file of the configs folder: the templates, the loader they name, one YAML per
    (task, length) and per generation variant, one group of each kind per length and the groups of them all."""
    files = {TEMPLATE: template_yaml(), GEN_TEMPLATE: gen_template_yaml(), LOADER.name: LOADER.read_text()}
    generative = [t for t in tasks if BY_NAME[t].generative]
    for generation, members, metric in ((False, tasks, CHOICE[1]), (True, generative, GENERATION[1])):
        if not members:
            continue
        for length in lengths:
            files |= {f"{task_name(t, length, generation)}.yaml": task_yaml(t, length, generation) for t in members}
            group = group_name(length, generation)
            files[f"{group}.yaml"] = group_yaml(group, [task_name(t, length, generation) for t in members], metric)
        top = group_name(generation=generation)
        files[f"{top}.yaml"] = group_yaml(top, [group_name(n, generation) for n in lengths], metric)
    return files


# -- the command -----------------------------------------------------------------------------------


def length_arg(text: str) -> int:
    value = positive_int(text)
    if value < MIN_LENGTH:
        raise argparse.ArgumentTypeError(f"must be >= {MIN_LENGTH} tokens (room for a haystack), got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tasks.generate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=PACKAGE, help="folder that receives data/ and configs/")
    parser.add_argument(
        "--tasks",
        nargs="+",
        choices=TASK_NAMES,
        default=list(TASK_NAMES),
        metavar="TASK",
        help=f"tasks to write (default all: {', '.join(TASK_NAMES)})",
    )
    parser.add_argument("--items", type=positive_int, default=ITEMS, help="documents per (task, length)")
    parser.add_argument("--lengths", nargs="+", type=length_arg, default=list(LENGTHS), help="target tokens")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--model", default=None, help="whose tokenizer counts the tokens (default SmolLM2-135M)")
    parser.add_argument("--force", action="store_true", help="replace existing files")
    args = parser.parse_args(argv)
    labels = [length_label(n) for n in args.lengths]
    if len(set(labels)) < len(labels):
        parser.error(f"argument --lengths: two lengths share a name ({', '.join(labels)}); give distinct lengths")
    args.tasks = list(dict.fromkeys(args.tasks))
    # a config file that already says what it would be written as (this package's loader) is no obstacle
    existing = [p for p in data_paths(args.out, args.tasks, args.lengths) if p.exists()]
    existing += [
        args.out / "configs" / name
        for name, text in config_files(args.tasks, args.lengths).items()
        if _differs(args.out / "configs" / name, text)
    ]
    if existing and not args.force:
        parser.error(
            f"argument --out: {existing[0]} exists ({len(existing)} of the files to write do); "
            "choose another --out or pass --force"
        )
    args.source = for_command(parser, args.model or DEFAULT)
    return args


def data_paths(out: Path, tasks: list[str], lengths: list[int]) -> list[Path]:
    return [out / "data" / data_file(t, n) for t in tasks for n in lengths]


def _differs(path: Path, text: str) -> bool:
    return path.exists() and path.read_text(encoding="utf-8") != text


def write(
    out: Path,
    tasks: list[str],
    lengths: list[int],
    items: int,
    seed: int,
    src: Sources,
    force: bool,
    progress: bool = True,
) -> list[Path]:
    """Write the documents and configs; the paths written."""
    from tqdm import tqdm

    written = []
    with tqdm(total=len(tasks) * len(lengths) * items, desc="documents", disable=not progress) as bar:
        for task in tasks:
            for length in lengths:
                lines = []
                for i in range(items):
                    lines.append(doc_line(make_doc(task, length, seed, i, src)))
                    bar.update()
                data = gzip.compress("".join(lines).encode("utf-8"), mtime=0)
                written.append(write_bytes_atomic(out / "data" / data_file(task, length), data, overwrite=force))
    for name, text in config_files(tasks, lengths).items():
        path = out / "configs" / name
        if not path.exists() or _differs(path, text):
            written.append(write_atomic(path, text, overwrite=force))
    return written


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    src = sources(args.source.tokenizer())
    paths = write(args.out, args.tasks, args.lengths, args.items, args.seed, src, args.force)
    print(f"wrote {len(paths)} files under {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
