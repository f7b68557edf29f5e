"""The body of POST /api/probes/score and its answer: probes scored over given inputs, unsteered,
recording nothing."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, NonNegativeInt

# Strict: unknown keys refused (a misspelt `prompt_tokens` must not pass), JSON types as sent
from millm.formats.probe_documents import RequestProbes, Strict

MAX_INPUTS = 64  # inputs one request scores (each is one forward pass)
Window = Literal["all", "prompt", "response", "last_user"]


class TokenInput(Strict):
    """Token ids as the model reads them; `prompt_tokens` of them are the prompt (the rest the
    response)."""

    token_ids: Annotated[list[NonNegativeInt], Field(min_length=1)]
    prompt_tokens: NonNegativeInt | None = None


class Message(Strict):
    """One turn of a conversation."""

    role: Literal["system", "user", "assistant"]
    content: str


class MessagesInput(Strict):
    """A conversation, rendered by the model's chat template as a chat request's is. One ending in
    an assistant turn is a prompt (the turns before it) and that turn as the response."""

    messages: Annotated[list[Message], Field(min_length=1)]


class TextInput(Strict):
    """Text tokenised as a text completion's prompt is (with the tokenizer's BOS); all prompt."""

    text: Annotated[str, Field(min_length=1)]


class ProbeScoreRequest(Strict):
    """Probes (saved, by name or id, or inline; none: every saved probe that fits the model) scored
    over each input, per window."""

    model: str | None = Field(None, description="The model to read with (default: the loaded one).")
    probes: RequestProbes | None = None
    inputs: Annotated[
        list[TokenInput | MessagesInput | TextInput], Field(min_length=1, max_length=MAX_INPUTS)
    ]
    windows: Annotated[list[Window], Field(min_length=1)] = ["all"]
    return_token_ids: bool = False


class WindowVerdict(BaseModel):
    """One probe over one window of one input: where it fired, or why it was not scored."""

    probe: str
    window: Window
    fired: bool | None  # None: not scored (not_scored_reason says why), never read as False
    peak: float | None
    peak_position: int | None
    first_position: int | None
    positions: list[int]  # where it fired (the first 64)
    threshold: float
    span: tuple[int, int] | None  # the positions the window covers, [start, end)
    scored_positions: int
    not_scored_reason: str | None = None


class InputError(BaseModel):
    """Why one input was not scored (the others were)."""

    code: str
    message: str


class InputResult(BaseModel):
    """One input's verdicts (or its error)."""

    index: int
    input_kind: Literal["token_ids", "messages", "text"]
    n_tokens: int | None
    prompt_tokens: int | None  # None: where the prompt ends is not known
    token_ids: list[int] | None = None  # with return_token_ids
    verdicts: list[WindowVerdict]
    error: InputError | None = None


class ScoredProbe(BaseModel):
    """A probe of the request as it was bound to the model."""

    name: str
    source: Literal["saved", "inline"]
    read_point: int  # the residual point it reads: after block N (-1: the embeddings)
    threshold: float


class ProbeScores(BaseModel):
    """The answer: the model read with, the probes, those left out, and each input's verdicts."""

    object: Literal["probe.scores"] = "probe.scores"
    model: str
    probes: list[ScoredProbe]
    skipped: list[dict]  # saved probes that do not fit the model (when none were named)
    results: list[InputResult]
