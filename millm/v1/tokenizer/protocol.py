"""The tokenizer routes' bodies, as vLLM names them (beyond the spec, issue 34): POST /tokenize,
POST /detokenize, GET /tokenizer_info; lm-evaluation-harness's remote tokenizer reads them."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from millm.v1.objects import WireModel
from millm.v1.policy.body_fields import OpenBody


class TokenizeRequest(OpenBody):
    """POST /tokenize: a text, tokenised as /v1/completions tokenises a prompt."""

    model: str | None = None  # the loaded model when absent
    prompt: str
    add_special_tokens: bool | None = None  # the tokenizer's BOS and the like; true when absent
    return_token_strs: bool | None = None


class TokenizeResponse(WireModel):
    """The ids, their count, and the model's context window."""

    omit_when_none = frozenset({"token_strs"})

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenBody):
    """POST /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[int] = Field(json_schema_extra={"items": {"type": "integer", "minimum": 0}})


class DetokenizeResponse(WireModel):
    """The text the ids decode to (special tokens included)."""

    prompt: str


class TokenizerInfo(WireModel):
    """GET /tokenizer_info: what a client needs to tokenise and template as the server does."""

    model_config = ConfigDict(extra="allow")

    model: str
    tokenizer_class: str
    vocab_size: int
    model_max_length: int
    bos_token: str | None
    eos_token: str | None
    pad_token: str | None
    unk_token: str | None
    chat_template: str | None
