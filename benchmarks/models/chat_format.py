"""How a tool turns its prompts into the model's input: the model's own chat template, a Jinja
template from a file (`--chat-template FILE`), or the prompts' text alone (`--plain-prompts`, for a
model that ships no template, as Gemma 3 270M's GGUF does).

Plain prompts are tokenized as the tokenizer does by default, its own special tokens included (a BOS
where the model wants one); a template writes its special tokens itself, so its text is tokenized
without. Results record which was used (`ChatFormat.describe`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from reference.records import file_digest


@dataclass(frozen=True)
class ChatFormat:
    template: str | None = None  # the text of --chat-template, None: the model's own template
    file: Path | None = None  # where `template` was read
    plain: bool = False  # --plain-prompts: no chat formatting at all

    def apply(self, tokenizer):
        """`tokenizer` with --chat-template's template in place of its own (the same tokenizer)."""
        if self.template is not None:
            tokenizer.chat_template = self.template
        return tokenizer

    def render(self, tokenizer, chat: list[dict]) -> str:
        """The text of one chat (messages), ready for the assistant's turn."""
        if self.plain:
            return "\n\n".join(message["content"] for message in chat)
        return tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)

    def encode(self, tokenizer, texts, **kwargs):
        """`tokenizer(texts, ...)` for texts `render` made: the tokenizer adds its special tokens to plain
        prompts only (a template's text holds its own)."""
        return tokenizer(texts, add_special_tokens=self.plain, **kwargs)

    def describe(self) -> dict:
        """The results' `chat_template` field: source "model" (the model's own), "file" (with the file
        and its sha256, 16 hex digits) or "none" (plain prompts)."""
        if self.plain:
            return {"source": "none"}
        if self.file is None:
            return {"source": "model"}
        return {"source": "file", "file": str(self.file), "sha256": file_digest(self.file)}

    def options(self) -> str:
        """The command-line options that give this format ("" for the model's template)."""
        if self.plain:
            return " --plain-prompts"
        return "" if self.file is None else f" --chat-template {self.file}"


#: The default: the model's own chat template.
MODEL_TEMPLATE = ChatFormat()


def add_options(parser: argparse.ArgumentParser, plain: bool = True) -> None:
    """--chat-template FILE and, where prompts make sense without a chat, --plain-prompts (one or the other)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--chat-template",
        type=Path,
        metavar="FILE",
        help="a Jinja chat template used instead of the model's (a model that ships none)",
    )
    if plain:
        group.add_argument(
            "--plain-prompts", action="store_true", help="feed the prompts' text alone, without chat formatting"
        )
