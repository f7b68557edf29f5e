"""Who writes and who scores explanations: the served model (unsteered), another registered model
loaded beside it for the job, or the operator's endpoint.

Both answer the same two questions. `write`: a chat's answer, greedy. `yes`: for each detection
chat, the probability that the answer is `[1]` rather than `[0]`, delphi's P("1") / (P("0") +
P("1")). The served model reads it off the next token after "[" in one scoring pass per chat (no
text to parse); the endpoint is asked for a short greedy answer with top_logprobs, read as delphi
reads it (the digits among the top alternatives of the answer's first digit token), else by the
first [0] or [1] in its text, else no answer.
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Protocol

import httpx

from millm.engine.jobs import Ranking, RowSpec
from millm.engine.prompts import chat_prompt_ids
from millm.engine.sampling import SamplingParams
from millm.errors import InvalidRequest
from millm.kernel.model.loading import Planned
from millm.kernel.runtime.blocking import Engine, generate_blocking, passes_blocking
from millm.kernel.runtime.remote import post_json
from millm.lab.labels.explain_prompts import Messages
from millm.lab.labels.parts import LabelParts

ENDPOINT_TIMEOUT_S = 120.0
ENDPOINT_TOP = 5  # delphi asks for 5 alternatives per token
ANSWER_TOKENS = 8  # room for "[1]" and a little slack
LIST = re.compile(r"\[.*?\]")


class Writer(Protocol):
    """Writes explanations or judges detection chats."""

    @property
    def name(self) -> str:
        """Provenance: 'served:<model>' or 'endpoint:<model>'."""
        ...

    def write(
        self, messages: Messages, max_tokens: int, cancel: threading.Event, start: str = ""
    ) -> str:
        """The chat's greedy answer; the served model's begins with `start` (an endpoint ignores
        it)."""
        ...

    def yes(self, chats: list[Messages], cancel: threading.Event) -> list[float | None]:
        """Each chat's probability of answering [1]; None where no answer could be read."""
        ...


def digit_ids(tokenizer) -> tuple[int, int]:
    """The ids of "1" and "0" as the token after "["; 400 naming `scorer` when either is not one
    token."""
    ids = []
    for digit in ("1", "0"):
        pair = tokenizer("[" + digit, add_special_tokens=False)["input_ids"]
        alone = tokenizer("[", add_special_tokens=False)["input_ids"]
        if pair[: len(alone)] != alone or len(pair) != len(alone) + 1:
            raise InvalidRequest(
                f"this model's tokenizer does not spell [{digit} as [ then {digit}, so it cannot "
                "answer delphi's detection prompt; score with the endpoint (scorer: endpoint)",
                param="scorer",
            )
        ids.append(pair[-1])
    return ids[0], ids[1]


class ServedWriter:
    """The loaded model, unsteered, or a model the job loaded beside it (an Engine): generation for
    explanations, one scoring pass per detection chat."""

    def __init__(self, state: LabelParts, model: str | Engine, tokenizer):
        self.state, self.model, self.tokenizer = state, model, tokenizer

    @property
    def name(self) -> str:
        if isinstance(self.model, str):
            return f"served:{self.model}"
        return f"model:{self.model.name}"

    def write(
        self, messages: Messages, max_tokens: int, cancel: threading.Event, start: str = ""
    ) -> str:
        # An answer begun with `start` is continued (chat_prompt_ids continues a trailing
        # assistant message), up to the end of its line.
        asked = [*messages, {"role": "assistant", "content": start}] if start else messages
        row = RowSpec(
            prompt_ids=tuple(chat_prompt_ids(self.tokenizer, asked)),
            sampling=SamplingParams(temperature=0.0),
            max_tokens=max_tokens,
            stop=("\n",) if start else (),
        )
        return (
            start + generate_blocking(self.state.switch, self.model, [row], cancel=cancel)[0].text
        )

    def yes(self, chats: list[Messages], cancel: threading.Event) -> list[float | None]:
        one, zero = digit_ids(self.tokenizer)
        bracket = self.tokenizer("[", add_special_tokens=False)["input_ids"]
        prompts = [chat_prompt_ids(self.tokenizer, chat) + bracket for chat in chats]
        ranking = Ranking((one, zero), 0.0, None)
        # Every chat starts with the same few-shot turns: the prefix cache keeps their KV.
        answered = passes_blocking(
            self.state.switch,
            self.model,
            prompts,
            ranking=ranking,
            cancel=cancel,
            reuse_prefix=True,
        )
        if answered is None:
            return [None] * len(chats)
        out: list[float | None] = []
        for scored in answered.scored:
            weight = {token: math.exp(lp) for token, lp in scored.ranked}
            total = weight.get(one, 0.0) + weight.get(zero, 0.0)
            out.append(weight.get(one, 0.0) / total if total > 0 else None)
        return out


class BesideWriter:
    """A registered model the job loads beside the served one (`planned`): it writes and scores
    as the served model does once the job has bound it to the loaded model, for the job's length."""

    def __init__(self, planned: Planned):
        self.planned = planned
        self.bound: ServedWriter | None = None

    @property
    def name(self) -> str:
        return f"model:{self.planned.name}"

    def _writer(self) -> ServedWriter:
        if self.bound is None:
            raise RuntimeError(f"{self.name} is used before the job loaded it")
        return self.bound

    def write(
        self, messages: Messages, max_tokens: int, cancel: threading.Event, start: str = ""
    ) -> str:
        return self._writer().write(messages, max_tokens, cancel, start)

    def yes(self, chats: list[Messages], cancel: threading.Event) -> list[float | None]:
        return self._writer().yes(chats, cancel)


class EndpointWriter:
    """An OpenAI-compatible chat completions server the operator configured."""

    def __init__(self, base_url: str, model: str, api_key: str | None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @property
    def name(self) -> str:
        return f"endpoint:{self.model}"

    def _ask(self, body: dict) -> dict:
        with httpx.Client(timeout=ENDPOINT_TIMEOUT_S, headers=self.headers) as client:
            return post_json(client, self.url, {"model": self.model, **body}, "explainer endpoint")

    def write(
        self, messages: Messages, max_tokens: int, cancel: threading.Event, start: str = ""
    ) -> str:
        answer = self._ask({"messages": messages, "max_tokens": max_tokens, "temperature": 0})
        return str(((answer.get("choices") or [{}])[0].get("message") or {}).get("content") or "")

    def yes(self, chats: list[Messages], cancel: threading.Event) -> list[float | None]:
        out: list[float | None] = []
        for chat in chats:
            if cancel.is_set():
                break
            body = {
                "messages": chat,
                "max_tokens": ANSWER_TOKENS,
                "temperature": 0,
                "logprobs": True,
                "top_logprobs": ENDPOINT_TOP,
            }
            out.append(read_yes(self._ask(body)))
        return out + [None] * (len(chats) - len(out))


def read_yes(answer: dict) -> float | None:
    """P([1]) in a chat completion: from the top alternatives of its first token holding a 0 or a
    1 (delphi's reading), else 1.0 or 0.0 by the first [..] list in its text, else None."""
    choice = (answer.get("choices") or [{}])[0]
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        if "1" in str(entry.get("token", "")) or "0" in str(entry.get("token", "")):
            weights = {"0": 0.0, "1": 0.0}
            for alternative in entry.get("top_logprobs") or []:
                token = str(alternative.get("token", ""))
                digit = "0" if "0" in token else "1" if "1" in token else None
                if digit is not None:
                    weights[digit] += math.exp(alternative["logprob"])
            total = weights["0"] + weights["1"]
            if total > 0:
                return weights["1"] / total
            break
    text = str((choice.get("message") or {}).get("content") or "")
    found = LIST.search(text)
    if found is None:
        return None
    try:
        values = json.loads(found.group(0))
    except ValueError:
        return None
    if not isinstance(values, list) or len(values) != 1 or values[0] not in (0, 1):
        return None
    return float(values[0])


def writer_for(
    state: LabelParts,
    who: str,
    model: str,
    tokenizer,
    param: str,
    beside: BesideWriter | None = None,
) -> Writer:
    """The writer a request named: the served model, the model the job loads `beside` it, or the
    configured endpoint (400 naming `param` when none is configured)."""
    if who == "served":
        return ServedWriter(state, model, tokenizer)
    if who == "model":
        return ServedWriter(state, model, tokenizer) if beside is None else beside
    settings = state.settings
    if not settings.explainer_base_url or not settings.explainer_model:
        raise InvalidRequest(
            "no explainer endpoint is configured on this server (MILLM_EXPLAINER_BASE_URL and "
            "MILLM_EXPLAINER_MODEL)",
            param=param,
        )
    key = settings.explainer_api_key
    return EndpointWriter(
        settings.explainer_base_url,
        settings.explainer_model,
        key.get_secret_value() if key is not None else None,
    )
