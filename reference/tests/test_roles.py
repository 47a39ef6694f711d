"""The three-axis tagger: roles and turns of a rendered ChatML chat, tokens by their offsets."""

import itertools

import pytest

from reference.tokens import roles
from reference.tokens.roles import ALL_TAGS, CHATML, ROLES, Tag, character_spans, tag_table, tag_tokens

CHAT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
    '<|im_start|>assistant\n<think>call the tool</think><tool_call>{"name": "weather"}</tool_call><|im_end|>\n'
    '<|im_start|>tool\n{"temp": 3}<|im_end|>\n'
    "<|im_start|>assistant\nIt is 3 C.<|im_end|>\n"
    "<|im_start|>user\n<tool_response>ok</tool_response> And Bergen?<|im_end|>\n"
    "<|im_start|>assistant\n<think>again"
)


def role_of(text, needle, nth=0):
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    for a, b, role, turn in character_spans(text):
        if a <= at < b:
            return ROLES[role], turn
    raise AssertionError(f"{needle!r} in no span")


@pytest.mark.parametrize(
    ("needle", "nth", "role", "turn"),
    [
        ("Be brief", 0, "system", 1),
        ("Weather", 0, "user query", 1),
        ("call the tool", 0, "reasoning", 1),
        ('{"name"', 0, "tool call", 1),
        ('{"temp"', 0, "tool observation", 1),
        ("It is 3", 0, "answer", 1),
        ("ok</tool_response>", 0, "tool observation", 2),
        ("And Bergen", 0, "user query", 2),
        ("again", 0, "reasoning", 2),  # thinking still open at the end of the text
        ("<|im_start|>", 3, "template", 1),
        ("<tool_call>", 0, "template", 1),
        ("</think>", 0, "template", 1),
        ("<|im_end|>", 0, "template", 1),
    ],
)
def test_every_character_gets_its_role_and_turn(needle, nth, role, turn):
    assert role_of(CHAT, needle, nth) == (role, turn)


def test_spans_cover_the_text_once_in_order():
    spans = character_spans(CHAT)
    assert spans[0][0] == 0 and spans[-1][1] == len(CHAT)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_tokens_take_the_tag_of_their_first_character_and_recency_counts_turns_back():
    text = "".join(f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\na{i}<|im_end|>\n" for i in range(5))
    offsets = [(m, m + 2) for i in range(5) for m in (text.index(f"q{i}"), text.index(f"a{i}"))]
    tags = tag_tokens(text, offsets)
    assert [t.recency for t in tags] == [3, 3, 3, 3, 2, 2, 1, 1, 0, 0]
    assert [ROLES[t.role] for t in tags[:2]] == ["user query", "answer"]
    assert tag_tokens(text, [(0, 0)]) == [Tag(3, 0, roles.TEMPLATE)]  # an empty span: where the text is


def test_image_placeholders_are_the_image_modality():
    text = "<|im_start|>user\nlook <image> here<|im_end|>\n"
    at = text.index("<image>")
    tags = tag_tokens(text, [(at, at + 7), (text.index("here"), text.index("here") + 4)])
    assert [t.modality for t in tags] == [1, 0] and tags[0].role == roles.USER


def test_a_table_keeps_the_tags_that_occur_in_a_fixed_order():
    assert len(ALL_TAGS) == 56 and len(set(ALL_TAGS)) == 56
    tags = [Tag(1, 0, 5), Tag(0, 0, 1), Tag(1, 0, 5)]
    assert tag_table(tags) == (Tag(0, 0, 1), Tag(1, 0, 5))
    assert str(Tag(0, 0, 1)) == "current / text / user query"


def test_unknown_roles_and_offsets_off_the_text_are_refused():
    with pytest.raises(ValueError, match="unknown chat role 'narrator'"):
        character_spans("<|im_start|>narrator\nhi<|im_end|>\n")
    with pytest.raises(ValueError, match=r"offsets \(0, 99\) lie outside"):
        tag_tokens("<|im_start|>user\nhi<|im_end|>\n", [(0, 99)])
    assert CHATML.start == "<|im_start|>"
