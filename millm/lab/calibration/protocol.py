"""What a calibration reads: the request's body, and its texts as token ids within the bounds.

Texts are tokenised as /v1/completions tokenises a prompt (verbatim, with the tokenizer's
special tokens); conversations are rendered with the model's chat template as
/v1/chat/completions renders them (a trailing assistant message is continued, not answered).
Each is cut to `max_tokens_per_text`, and the whole is refused (400) past
MILLM_CALIBRATION_MAX_TOKENS before anything runs. `{"corpus": "demo"}` reads the corpus shipped
in the SAE's folder (`calibration_corpus.jsonl`: one `{"text": ...}` or `{"messages": [...]}`
per line), which the demo SAE has.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from millm.engine.prompts import chat_prompt_ids, completion_prompt_ids
from millm.errors import InvalidRequest
from millm.interp.sae_files import SAEInfo

CORPUS_FILE = "calibration_corpus.jsonl"
MAX_TOP_EXAMPLES = 20
MAX_TOKENS_PER_TEXT = 8192


class CalibrationMessage(BaseModel):
    """One message of a conversation to read (text only)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str


class CalibrateRequest(BaseModel):
    """POST /api/saes/{id}/calibrate: the shipped corpus, or texts and/or conversations; how many
    snippets to keep per feature and where to cut long texts."""

    model_config = ConfigDict(strict=True, extra="forbid")

    corpus: Literal["demo"] | None = Field(
        None, description='"demo": the corpus shipped with the SAE (the demo SAE has one).'
    )
    texts: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="Plain texts, read as /v1/completions reads a prompt."
    )
    conversations: list[Annotated[list[CalibrationMessage], Field(min_length=1)]] | None = Field(
        None,
        description="Conversations, rendered with the model's chat template as "
        "/v1/chat/completions renders them.",
    )
    top_examples: Annotated[int, Field(ge=0, le=MAX_TOP_EXAMPLES)] = Field(
        5, description="Top activating snippets kept per feature."
    )
    max_tokens_per_text: Annotated[int, Field(ge=2, le=MAX_TOKENS_PER_TEXT)] = Field(
        256, description="Each text is cut to this many tokens."
    )
    max_tokens: Annotated[int, Field(ge=2)] | None = Field(
        None,
        description="A budget in tokens: the texts are read in order until this many tokens have "
        "been read (the text that reaches it is cut there).",
    )
    max_seconds: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="A budget in time: reading stops once this many seconds have passed, and the "
        "calibration is made from the texts read by then (its summary says how many).",
    )


def check_source(request: CalibrateRequest) -> None:
    """The shipped corpus, or texts and/or conversations (at least one text): a 400 naming the
    field otherwise."""
    if request.corpus is not None and (
        request.texts is not None or request.conversations is not None
    ):
        raise InvalidRequest("give corpus, or texts and/or conversations, not both", param="corpus")
    if request.corpus is None and not request.texts and not request.conversations:
        raise InvalidRequest(
            'give corpus ("demo"), or texts and/or conversations with at least one text',
            param="texts",
        )


@dataclass(frozen=True)
class Corpus:
    """Token ids of every text to read, in order (texts, then conversations)."""

    name: str  # "demo" or "request"
    texts: list[np.ndarray]  # int32 ids, each cut to max_tokens_per_text
    truncated: int

    @property
    def tokens(self) -> int:
        """Tokens fed, all texts together."""
        return sum(len(ids) for ids in self.texts)

    def first_tokens(self, budget: int | None) -> Corpus:
        """The texts in order up to `budget` tokens in all (the last one cut to fit); all without
        one."""
        if budget is None or self.tokens <= budget:
            return self
        kept: list[np.ndarray] = []
        left = budget
        for ids in self.texts:
            if left < 2:  # a text of one token has no position to read
                break
            kept.append(ids[:left])
            left -= len(kept[-1])
        return Corpus(self.name, kept, self.truncated)

    def first_texts(self, count: int) -> Corpus:
        """The first `count` texts (what a calibration stopped by its time budget read)."""
        return (
            self
            if count >= len(self.texts)
            else Corpus(self.name, self.texts[:count], self.truncated)
        )


# where it came from (for messages), and a text or a conversation
Entry = tuple[str, str | list[CalibrationMessage]]


def shipped_entries(info: SAEInfo) -> list[Entry]:
    """The texts and conversations of the corpus shipped in the SAE's folder, in file order (400
    when it has none)."""
    folder = Path(info.path)
    path = (folder if folder.is_dir() else folder.parent) / CORPUS_FILE
    if not path.is_file():
        raise InvalidRequest(
            f"SAE {info.id} ships no calibration corpus ({CORPUS_FILE}); send texts or "
            "conversations",
            param="corpus",
        )
    entries: list[Entry] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{CORPUS_FILE} line {number}"
        try:
            entry = json.loads(line)
            if "messages" in entry:
                entries.append(
                    (where, [CalibrationMessage.model_validate(m) for m in entry["messages"]])
                )
            else:
                entries.append((where, str(entry["text"])))
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            raise InvalidRequest(
                f"{where} is not a text or a conversation ({exc})", param="corpus"
            ) from None
    return entries


def request_entries(request: CalibrateRequest) -> list[Entry]:
    """The request's texts, then its conversations."""
    entries: list[Entry] = [(f"texts[{i}]", text) for i, text in enumerate(request.texts or [])]
    entries += [
        (f"conversations[{i}]", messages) for i, messages in enumerate(request.conversations or [])
    ]
    return entries


def corpus_ids(tokenizer, request: CalibrateRequest, info: SAEInfo, context_length: int) -> Corpus:
    """Every text of a checked request (check_source: texts, then conversations) or of the shipped
    corpus (in file order) as token ids, cut to max_tokens_per_text (and the model's context
    length)."""
    entries = shipped_entries(info) if request.corpus is not None else request_entries(request)
    limit = min(request.max_tokens_per_text, context_length)
    out: list[np.ndarray] = []
    truncated = 0
    for where, content in entries:
        ids = (
            completion_prompt_ids(tokenizer, content)
            if isinstance(content, str)
            else rendered_conversation(tokenizer, content, where)
        )
        if not ids:
            raise InvalidRequest(
                f"{where} tokenises to nothing", param=where if request.corpus is None else "corpus"
            )
        truncated += len(ids) > limit
        out.append(np.asarray(ids[:limit], dtype=np.int32))
    return Corpus("demo" if request.corpus is not None else "request", out, truncated)


def rendered_conversation(tokenizer, messages: list[CalibrationMessage], where: str) -> list[int]:
    """A conversation's token ids through the chat template; its refusal names the conversation."""
    try:
        return chat_prompt_ids(tokenizer, [_template(m) for m in messages])
    except InvalidRequest as exc:
        exc.param = where if where.startswith("conversations") else "corpus"
        exc.message = f"{where}: {exc.message}"
        raise


def _template(message: CalibrationMessage) -> dict:
    """A message as the chat template takes it; `developer` is OpenAI's newer name for `system`."""
    return {
        "role": "system" if message.role == "developer" else message.role,
        "content": message.content,
    }


def check_size(corpus: Corpus, max_tokens: int, param: str) -> None:
    """Refuse a corpus over MILLM_CALIBRATION_MAX_TOKENS (400) before anything runs."""
    if corpus.tokens > max_tokens:
        raise InvalidRequest(
            f"{len(corpus.texts)} texts of {corpus.tokens} tokens (after max_tokens_per_text) are "
            f"over MILLM_CALIBRATION_MAX_TOKENS ({max_tokens}); send fewer or shorter texts",
            param=param,
        )
