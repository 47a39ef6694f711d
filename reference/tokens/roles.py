"""Token tags on three axes (TriAxialKV, arXiv 2605.17170): recency, modality, semantic role.

A CPU tagger that reads a rendered chat (its template's markers, no model inference) and gives
every token one tag. The axes, as this project fixes them (the paper names the axes and their
sizes; the tables below are ours, written down so that results can be reproduced):

- recency to the current turn, 4 values: a turn begins where a user message begins (what comes
  before the first user message belongs to the first turn); a token is "current" in the last
  turn of the text, then "previous", "two back", and "older" for three turns back or more;
- modality, 2 values: "image" for the spans of an image placeholder, else "text";
- semantic role, 7 values: "system" (system message text), "user query" (user message text),
  "tool call" (inside the assistant's tool-call markers), "tool observation" (a tool message, or
  tool-response markers inside a user message), "reasoning" (inside the assistant's thinking
  markers, to the end of the text while unclosed), "answer" (the rest of an assistant message),
  "template" (the chat template's own markers: message headers and ends, and the tool-call,
  tool-response and thinking markers themselves, and anything outside a message).

`ChatMarkers` holds the markers; its default is ChatML (`<|im_start|>role\\n ... <|im_end|>\\n`,
SmolLM2-Instruct's and Qwen's template) with Hermes-style `<tool_call>` / `<tool_response>`
and `<think>` markers, which need not be special tokens: tagging reads characters and maps
them to tokens by the tokenizer's character offsets.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

RECENCY = ("current", "previous", "two back", "older")
MODALITIES = ("text", "image")
ROLES = ("system", "user query", "tool call", "tool observation", "reasoning", "answer", "template")
SYSTEM, USER, TOOL_CALL, OBSERVATION, REASONING, ANSWER, TEMPLATE = range(len(ROLES))


@dataclass(frozen=True, order=True)
class Tag:
    """One token's tag: indices into RECENCY, MODALITIES and ROLES."""

    recency: int
    modality: int
    role: int

    def __str__(self) -> str:
        return f"{RECENCY[self.recency]} / {MODALITIES[self.modality]} / {ROLES[self.role]}"


#: Every tag, in a fixed order (4 x 2 x 7 = 56); a tag table keeps those that occur.
ALL_TAGS = tuple(Tag(r, m, s) for r in range(len(RECENCY)) for m in range(len(MODALITIES)) for s in range(len(ROLES)))


@dataclass(frozen=True)
class ChatMarkers:
    """The markers of a chat template, as they appear in the rendered text."""

    start: str = "<|im_start|>"
    end: str = "<|im_end|>"
    header_end: str = "\n"  # ends the role name after `start`
    user_roles: tuple[str, ...] = ("user",)
    system_roles: tuple[str, ...] = ("system",)
    assistant_roles: tuple[str, ...] = ("assistant",)
    tool_roles: tuple[str, ...] = ("tool", "ipython", "function")
    tool_call: tuple[str, str] = ("<tool_call>", "</tool_call>")
    tool_response: tuple[str, str] = ("<tool_response>", "</tool_response>")
    thinking: tuple[str, str] = ("<think>", "</think>")
    images: tuple[str, ...] = field(default=("<image>", "<|image_pad|>"))


CHATML = ChatMarkers()


def _inner_spans(text: str, lo: int, hi: int, body: int, pairs: Sequence[tuple[tuple[str, str], int]]):
    """Spans of [lo, hi): `body` outside the marked regions, each (open, close) region its role, the
    markers TEMPLATE; an unclosed region runs to hi."""
    out, pos = [], lo
    while pos < hi:
        hits = [(text.find(o, pos, hi), o, c, r) for (o, c), r in pairs if o]
        hits = [h for h in hits if h[0] >= 0]
        if not hits:
            break
        at, opener, closer, role = min(hits)
        out.append((pos, at, body))
        inner = at + len(opener)
        close = text.find(closer, inner, hi)
        stop = hi if close < 0 else close
        out += [(at, inner, TEMPLATE), (inner, stop, role)]
        pos = stop if close < 0 else close + len(closer)
        if close >= 0:
            out.append((close, pos, TEMPLATE))
    out.append((pos, hi, body))
    return [s for s in out if s[1] > s[0]]


def character_spans(text: str, markers: ChatMarkers = CHATML) -> list[tuple[int, int, int, int]]:
    """(start, end, role, turn) spans covering `text`, turns counted from 1 (module doc)."""
    spans, pos, turn = [], 0, 1
    seen_user = False
    header = re.compile(re.escape(markers.start) + r"([^\n]*?)" + re.escape(markers.header_end))
    while True:
        m = header.search(text, pos)
        if m is None:
            spans.append((pos, len(text), TEMPLATE, turn))
            break
        spans.append((pos, m.start(), TEMPLATE, turn))  # text between messages
        role = m.group(1).strip()
        if role in markers.user_roles:
            turn += seen_user
            seen_user = True
        spans.append((m.start(), m.end(), TEMPLATE, turn))
        end = text.find(markers.end, m.end())
        stop = len(text) if end < 0 else end
        if role in markers.system_roles:
            inner = [(m.end(), stop, SYSTEM)]
        elif role in markers.user_roles:
            inner = _inner_spans(text, m.end(), stop, USER, [(markers.tool_response, OBSERVATION)])
        elif role in markers.tool_roles:
            inner = _inner_spans(text, m.end(), stop, OBSERVATION, [(markers.tool_response, OBSERVATION)])
        elif role in markers.assistant_roles:
            pairs = [(markers.thinking, REASONING), (markers.tool_call, TOOL_CALL)]
            inner = _inner_spans(text, m.end(), stop, ANSWER, pairs)
        else:
            raise ValueError(f"unknown chat role {role!r} at character {m.start()}: add it to the ChatMarkers roles")
        spans += [(a, b, r, turn) for a, b, r in inner]
        if end < 0:
            break
        spans.append((end, end + len(markers.end), TEMPLATE, turn))
        pos = end + len(markers.end)
    return [s for s in spans if s[1] > s[0]]


def _image_ranges(text: str, markers: ChatMarkers) -> list[tuple[int, int]]:
    return sorted((m.start(), m.end()) for img in markers.images if img for m in re.finditer(re.escape(img), text))


def tag_tokens(text: str, offsets: Sequence[tuple[int, int]], markers: ChatMarkers = CHATML) -> list[Tag]:
    """The tag of every token of `text`, given each token's (start, end) character offsets (as a
    fast tokenizer's `return_offsets_mapping` gives them). A token takes the role and turn of its
    first character (of the previous token's end, for an empty span)."""
    spans = character_spans(text, markers)
    images = _image_ranges(text, markers)
    last_turn = max((s[3] for s in spans), default=1)
    starts = [s[0] for s in spans]
    tags, prev = [], 0
    for a, b in offsets:
        if not (0 <= a <= b <= len(text)):
            raise ValueError(f"token offsets ({a}, {b}) lie outside the text of {len(text)} characters")
        at = a if b > a else max(prev - 1, 0)
        prev = b if b > a else prev
        if not spans:
            tags.append(Tag(0, 0, TEMPLATE))
            continue
        span = spans[max(bisect.bisect_right(starts, at) - 1, 0)]
        recency = min(last_turn - span[3], len(RECENCY) - 1)
        modality = int(any(lo <= at < hi for lo, hi in images))
        tags.append(Tag(recency, modality, span[2]))
    return tags


def tag_conversation(tokenizer, messages: Sequence[dict], markers: ChatMarkers = CHATML, **template_kwargs):
    """(input_ids, tags) of a conversation rendered with the tokenizer's own chat template."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, **template_kwargs)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], tag_tokens(text, enc["offset_mapping"], markers)


def tag_table(tags: Sequence[Tag]) -> tuple[Tag, ...]:
    """The tags that occur, in ALL_TAGS order (combinations that never occur drop out)."""
    present = set(tags)
    return tuple(t for t in ALL_TAGS if t in present)


__all__ = [
    "ALL_TAGS",
    "CHATML",
    "MODALITIES",
    "RECENCY",
    "ROLES",
    "ChatMarkers",
    "Tag",
    "character_spans",
    "tag_conversation",
    "tag_table",
    "tag_tokens",
]


#: The tag of newly generated text: the current turn, text, an answer.
GENERATED = Tag(0, 0, ANSWER)
