"""POST /v1/chat/completions and /v1/completions: validate, build rows, answer whole or as SSE."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from millm.api import scoring
from millm.api.errors import error_body
from millm.api.field_policy import CHAT, COMPLETIONS, check_fields
from millm.api.headers import item, seed_header, token
from millm.api.prechecks import precheck
from millm.api.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields
from millm.api.scoring import InvalidScoringRequest, check_allowed, check_scoring, score_and_read
from millm.api.schema_subset import ResponseFormatUnsupported
from millm.api.structured import Structured, parse_response_format, refuse_combinations, validate_output
from millm.api.tools import CallHoldback, ToolPlan, offer_decision, parse_tools, read_answer, template_takes_tools, tool_messages
from millm.api.unused_fields import handle_unused, template_reads, unused_locations
from millm.engine.jobs import JobFailed, ResidualsRead, RowFinished, TextDelta
from millm.engine.loader import LoadedModel
from millm.engine.prompts import chat_prompt_ids, completion_prompt_ids, has_chat_template
from millm.engine.sampling import SamplingParams
from millm.engine.scoring import score
from millm.interp.intensity import echo
from millm.interp.mistudio import RUNG_LANGUAGE
from millm.errors import FieldNotHonoured, InvalidRequest, MillmError
from millm.service.activations import ActivationRead, ReadRequest, activations_block, plan_read, refuse
from millm.service.generation import GenerationOptions, JobStream, build_rows, completion_budget
from millm.service.steering import Plan
from millm.service.state import ServerState

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass
class ResponseMeta:
    """What every response and chunk of one request repeats."""

    id: str
    object: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Collected:
    """A non-streamed answer, assembled from the engine's events."""

    texts: list[str]
    finish_reasons: list[str | None]
    completion_tokens: int = 0
    reads: list = field(default_factory=list)  # ResidualsRead of the request's own SAE read


def generation_options(body: SamplingFields) -> GenerationOptions:
    """The engine's view of the sampling fields, with OpenAI's defaults filled in."""
    sampling = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
    )
    return GenerationOptions(
        max_tokens=body.token_budget, n=body.n or 1, sampling=sampling, stop=body.stop_sequences, seed=body.seed
    )


def message_text(message: ChatMessage, where: str) -> str:
    """A message's content as one string; text parts are joined by newlines."""
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise FieldNotHonoured(
                f"content part of type {part.type!r} cannot be honoured: this model reads text only",
                param=f"{where}.content[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def template_messages(messages: list[ChatMessage], param: str = "messages") -> list[dict]:
    """Messages as the chat template expects them; `developer` is OpenAI's newer name for `system`."""
    rendered = []
    for i, message in enumerate(messages):
        entry = {"role": "system" if message.role == "developer" else message.role, "content": message_text(message, f"{param}[{i}]")}
        for key in ("name", "tool_call_id"):
            value = getattr(message, key)
            if value is not None:
                entry[key] = value
        if message.tool_calls is not None:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        rendered.append(entry)
    return rendered


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def seed_scope(state: ServerState, batch_shaped: bool) -> str:
    """The promise X-miLLM-Seed states: extra_messages rows hold for the same batch composition;
    with continuous batching enabled the spec's promise is best-effort (the seeded request itself
    still runs on the serial path, in its own forward passes)."""
    if batch_shaped:
        return "batch-shape"
    return "best-effort" if state.settings.enable_continuous_batching else "request"


def seed_headers(seed: int | None, scope: str = "request") -> dict[str, str]:
    """X-miLLM-Seed (RFC 8941 item with its scope) when the request sent a seed."""
    return {} if seed is None else {"X-miLLM-Seed": seed_header(seed, scope)}


def steering_headers(plan: Plan) -> dict[str, str]:
    """X-miLLM-Steering always; X-miLLM-Steering-Intensity when a dial changed steering;
    X-miLLM-Circuit-Rung when a circuit genuinely steers (RFC 8941 items)."""
    headers = {"X-miLLM-Steering": token(plan.kind, **dict(plan.params))}
    if plan.intensity is not None:
        headers["X-miLLM-Steering-Intensity"] = echo(plan.intensity)
    if plan.rung is not None:
        headers["X-miLLM-Circuit-Rung"] = item(plan.rung, language=RUNG_LANGUAGE[plan.rung])
    return headers


def sse(payload: dict | str) -> str:
    """One server-sent event frame."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def watch_disconnect(request: Request, stream: JobStream) -> None:
    """Cancel the job when the client of a non-streamed request goes away."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stream.cancel()
            return


async def collect(request: Request, stream: JobStream, rows: int) -> Collected:
    """Run a job to the end, cancelling it if the client disconnects first."""
    result = Collected(texts=[""] * rows, finish_reasons=[None] * rows)
    watcher = asyncio.create_task(watch_disconnect(request, stream))
    try:
        async for event in stream.events():
            if isinstance(event, TextDelta):
                result.texts[event.row] += event.text
            elif isinstance(event, RowFinished):
                result.finish_reasons[event.row] = event.finish_reason
                result.completion_tokens += event.completion_tokens
            elif isinstance(event, ResidualsRead):
                result.reads.append(event)
            elif isinstance(event, JobFailed):
                raise event.error
    finally:
        watcher.cancel()
        stream.cancel()
    return result


async def start_job(state: ServerState, lm: LoadedModel, body: SamplingFields, prompts: list[list[int]], param: str, plan: Plan,
                    constraint=None, read: ActivationRead | None = None):
    """Build the rows for these prompts (steered by `plan`, constrained by `constraint`, read by
    `read` and by monitoring when it is on) and admit them."""
    reads = (read.engine_read(),) if read is not None else ()
    monitored = state.monitor.read_for(state.steering.attached)
    if monitored is not None:
        reads += (monitored[0],)
    rows = build_rows(lm, prompts, generation_options(body), state.settings.default_max_tokens, param, plan.edit, constraint, reads)
    stream = JobStream(rows, on_monitored=monitored[1] if monitored is not None else None)
    state.submit(stream.job)
    return stream, len(rows)


def refuse_multi_row_reads(body: SamplingFields, prompts: int) -> None:
    """return_sae_activations reads one row: there is no single position axis across several."""
    if body.return_sae_activations is None:
        return
    if (body.n or 1) > 1:
        raise refuse("n > 1 has several position axes; ask with n: 1")
    if getattr(body, "extra_messages", None):
        raise refuse("extra_messages rows have several position axes; ask without extra_messages")
    if prompts > 1:
        raise refuse("several prompts have several position axes; send one prompt")


def activation_read(state: ServerState, lm: LoadedModel, body: SamplingFields, asked: ReadRequest | None, prompts: list[list[int]], param: str) -> ActivationRead | None:
    """The request's SAE read bound to an attached SAE (400 before anything runs), or None when it asked for none."""
    if asked is None:
        return None
    refuse_multi_row_reads(body, len(prompts))
    budget = 0 if body.scoring else completion_budget(lm, len(prompts[0]), body.token_budget, state.settings.default_max_tokens, param)
    return plan_read(
        asked,
        state.steering.attached,
        prompt_tokens=len(prompts[0]),
        max_tokens=budget,
        max_entries=state.settings.sae_activations_max_entries,
    )


def read_blocks(read: ActivationRead | None, captured: list, unsteered: bool = False) -> dict:
    """The response's `millm` object (empty when the request asked for nothing)."""
    if read is None or not captured:
        return {}
    block = activations_block(read, captured[0], unsteered=unsteered)  # encoded already, on the scheduler thread
    return {"millm": {"sae_activations": block}}


def field_report(strict: bool, state: ServerState, body, scoring: bool, lm: LoadedModel | None, unused: tuple[str, ...] = ()) -> dict[str, str]:
    """X-miLLM-Ignored-Fields for this body, plus `unused` fields it sent (or 400 under X-miLLM-Strict)."""
    # An assistant's tool_calls are always rendered: by the template, or as <tool_call> blocks.
    reads = (template_reads(lm.tokenizer) | {"tool_calls"}) if lm is not None else set()
    sent = body.model_dump(exclude_unset=True)
    locations = unused_locations(body, scoring=scoring, reads=reads) + [field for field in unused if sent.get(field) is not None]
    return handle_unused(locations, strict, state.settings.ignored_fields_header_max_bytes)


def conversation_prompts(lm: LoadedModel, body: ChatCompletionRequest, tools: ToolPlan | None = None) -> list[list[int]]:
    """Token ids of `messages` and of each `extra_messages` conversation, with the offered tools;
    a failure names which conversation."""
    native = template_takes_tools(lm.tokenizer)
    listed = [tool.as_template() for tool in tools.tools] if native and tools is not None and tools.offered else None
    conversations = [("messages", body.messages)]
    conversations += [(f"extra_messages[{i}]", msgs) for i, msgs in enumerate(body.extra_messages or [])]
    prompts = []
    for param, messages in conversations:
        try:
            prompt = chat_prompt_ids(lm.tokenizer, tool_messages(template_messages(messages, param), tools, native), listed)
        except MillmError as exc:
            if param != "messages" and exc.param == "messages":  # the template's own complaint
                exc.param = param
                exc.message = f"{param}: {exc.message}"
            raise
        if not prompt:
            raise InvalidRequest(f"the rendered conversation {param} tokenises to nothing", param=param)
        prompts.append(prompt)
    return prompts


@router.post("/v1/chat/completions", summary="Chat completion (streaming and non-streaming), or chat scoring")
async def chat_completions(body: ChatCompletionRequest, request: Request):
    """Answer (or continue) a conversation, and each extra_messages conversation, with the loaded model."""
    state: ServerState = request.app.state.millm
    check_fields(body.model_dump(exclude_unset=True), CHAT, scoring=body.scoring, streaming=bool(body.stream))
    structured = parse_response_format(body)
    if structured is not None:
        refuse_combinations(body, state.settings.enable_continuous_batching)
    tools = parse_tools(body)
    if tools is not None and tools.offered and structured is not None:
        raise ResponseFormatUnsupported("response_format cannot be combined with tools: both would shape the same answer")
    temperature = check_scoring(body) if body.scoring else None
    refuse_multi_row_reads(body, 1)
    checked = await precheck(request, state, body, body.scoring)
    lm = await state.acquire(body.model)
    if body.scoring and not has_chat_template(lm.tokenizer):
        raise InvalidRequest(
            f"{lm.name} has no chat template, so there is no prompt to score; use /v1/completions with the prompt text",
            param="messages",
            code="no_chat_template",
        )
    tools, unused = offer_decision(tools, template_takes_tools(lm.tokenizer), lm.parameters, state.settings.prompted_tools)
    headers = field_report(checked.strict, state, body, body.scoring, lm, tuple(unused))
    prompts = await run_in_threadpool(conversation_prompts, lm, body, tools)
    meta = ResponseMeta(id=f"chatcmpl-{uuid.uuid4().hex}", object="chat.completion", model=lm.name)
    read = activation_read(state, lm, body, checked.read, prompts, "messages")
    if body.scoring:
        return await chat_scoring(state, lm, body, prompts, meta, temperature, headers, read)
    plan = state.planner.plan_for(body.profile, checked.dial)
    constraint = None
    if structured is not None:
        constraint = structured.spec
        headers = {**headers, "X-miLLM-Constrained": structured.header}
    elif tools is not None and tools.constrained:
        constraint = tools.grammar()
    if constraint is not None:
        await run_in_threadpool(lm.grammar.matcher, constraint)  # a schema the library refuses is a 400 now
    stream, rows = await start_job(state, lm, body, prompts, "messages", plan, constraint, read)
    scope = seed_scope(state, batch_shaped=bool(body.extra_messages))
    chunks, choice = chat_chunks, chat_choice
    if tools is not None:
        chunks = partial(chat_chunks, tools=tools)
        choice = partial(tool_choice, tools)
    response = await answer(request, lm, body, stream, rows, meta, sum(map(len, prompts)), chunks, choice, plan, headers, scope, structured, read)
    return response


async def chat_scoring(state, lm, body, prompts, meta, temperature, headers, read=None):
    """Score each conversation one at a time; a failing one fails the request, naming its index."""
    allowed = check_allowed(lm, body.allowed_token_ids)
    choices, captured = [], []
    for index, prompt in enumerate(prompts):
        try:
            answered = await score_and_read(state, [prompt], (read.engine_read(),) if read is not None else ())
            logits, captured = answered.logits[0], captured + answered.reads
            scored = score(logits, allowed, temperature)
            choices.append(scoring.chat_choice(lm, scored, index, bool(body.logprobs), body.top_logprobs, bool(body.return_tokens_as_token_ids)))
        except MillmError as exc:
            if len(prompts) > 1:
                exc.message = f"conversation {index} ({'messages' if index == 0 else f'extra_messages[{index - 1}]'}): {exc.message}"
            raise
    return scored_response(lm, body, meta, choices, prompts, headers, read_blocks(read, captured, unsteered=True))


def scored_response(lm, body, meta, choices, prompts, headers, extra: dict | None = None) -> JSONResponse:
    """The whole response of a scoring request (never steered, never streamed)."""
    payload = {
        "id": meta.id,
        "object": meta.object,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": lm.system_fingerprint,
        "choices": choices,
        "usage": usage(sum(map(len, prompts)), len(prompts)),
        **(extra or {}),
    }
    return JSONResponse(payload, headers={**headers, **seed_headers(body.seed), "X-miLLM-Steering": "none"})


def completion_prompts(lm: LoadedModel, body: CompletionRequest) -> tuple[list[list[int]], list[str]]:
    """Every prompt of a text completion as token ids (verbatim, no chat template), with its text."""
    prompt = body.prompt
    if isinstance(prompt, str):
        items: list = [prompt]
    elif all(isinstance(p, int) for p in prompt):
        items = [prompt]
    else:
        items = list(prompt)
    add_special = True if body.add_special_tokens is None else body.add_special_tokens
    error = InvalidScoringRequest if body.scoring else InvalidRequest
    prompts, texts = [], []
    vocab = lm.vocab_size
    for i, entry in enumerate(items):
        param = "prompt" if len(items) == 1 else f"prompt[{i}]"
        ids = completion_prompt_ids(lm.tokenizer, entry, add_special) if isinstance(entry, str) else list(entry)
        if not ids:
            raise error(f"{param} tokenises to nothing; a prompt needs at least one token", param=param)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise error(f"{param} holds token ids outside the vocabulary (0..{vocab - 1}): {bad[:5]}", param=param)
        prompts.append(ids)
        texts.append(entry if isinstance(entry, str) else lm.tokenizer.decode(ids))
    return prompts, texts


@router.post("/v1/completions", summary="Text completion (no chat template), or scoring mode")
async def completions(body: CompletionRequest, request: Request):
    """Continue each prompt verbatim (one choice per prompt), or score its next token."""
    state: ServerState = request.app.state.millm
    check_fields(body.model_dump(exclude_unset=True), COMPLETIONS, scoring=body.scoring, streaming=bool(body.stream))
    temperature = check_scoring(body) if body.scoring else None
    checked = await precheck(request, state, body, body.scoring)
    lm = await state.acquire(body.model)
    headers = field_report(checked.strict, state, body, body.scoring, lm)
    prompts, texts = await run_in_threadpool(completion_prompts, lm, body)
    meta = ResponseMeta(id=f"cmpl-{uuid.uuid4().hex}", object="text_completion", model=lm.name)
    read = activation_read(state, lm, body, checked.read, prompts, "prompt")
    if body.scoring:
        allowed = check_allowed(lm, body.allowed_token_ids)
        answered = await score_and_read(state, prompts, (read.engine_read(),) if read is not None else ())
        logits = answered.logits
        by_id = bool(body.return_tokens_as_token_ids)
        choices = [
            scoring.completion_choice(lm, score(row, allowed, temperature), i, texts[i], body.logprobs, allowed, by_id)
            for i, row in enumerate(logits)
        ]
        return scored_response(lm, body, meta, choices, prompts, headers, read_blocks(read, answered.reads, unsteered=True))
    plan = state.planner.plan_for(None, None)
    stream, rows = await start_job(state, lm, body, prompts, "prompt", plan, read=read)
    return await answer(request, lm, body, stream, rows, meta, sum(map(len, prompts)), completion_chunks, completion_choice, plan, headers,
                        seed_scope(state, batch_shaped=False), read=read)


def chat_choice(index: int, text: str, finish_reason: str | None) -> dict:
    """A whole chat choice."""
    message = {"role": "assistant", "content": text}
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish_reason}


def tool_choice(tools: ToolPlan, index: int, text: str, finish_reason: str | None) -> dict:
    """A whole chat choice of a request with tools: its text read for calls."""
    read = read_answer(tools, text, finish_reason, index)
    message = {"role": "assistant", "content": read.content}
    if read.calls:
        message["tool_calls"] = read.calls
    return {"index": index, "message": message, "logprobs": None, "finish_reason": read.finish_reason(finish_reason)}


def completion_choice(index: int, text: str, finish_reason: str | None) -> dict:
    """A whole text-completion choice."""
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


async def answer(request, lm: LoadedModel, body: SamplingFields, stream: JobStream, rows: int, meta: ResponseMeta,
                 prompt_tokens: int, chunks, choice, plan: Plan, headers: dict[str, str], seed_scope: str = "request",
                 structured: Structured | None = None, read: ActivationRead | None = None):
    """The response for an admitted job: SSE frames from `chunks`, or one body of `choice` objects."""
    headers = {**headers, **seed_headers(body.seed, seed_scope), **steering_headers(plan)}
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        frames = chunks(stream, meta, prompt_tokens, rows, include_usage, read)
        return StreamingResponse(frames, media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
    result = await collect(request, stream, rows)
    if structured is not None:
        for index, (text, reason) in enumerate(zip(result.texts, result.finish_reasons)):
            if reason == "stop":
                validate_output(structured, text, index)
    payload = {
        "id": meta.id,
        "object": meta.object,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": lm.system_fingerprint,
        "choices": [choice(i, text, result.finish_reasons[i]) for i, text in enumerate(result.texts)],
        "usage": usage(prompt_tokens, result.completion_tokens),
        **(read_blocks(read, result.reads)),
    }
    return JSONResponse(payload, headers=headers)


async def stream_frames(
    stream: JobStream, prompt_tokens: int, rows: int, include_usage: bool, chunk, delta, finish, opening=(), read=None
):
    """SSE frames for a job: opening chunks, deltas, one finish chunk per row (the last carries usage), [DONE].

    `chunk(choices, usage=...)` builds a chunk; `delta(row, text)` / `finish(row, reason)` return the
    choices to send, one chunk each (none while text is held back, several for a tool call).
    With stream_options.include_usage, usage instead comes in a final chunk with no choices, as OpenAI does.
    A request's SAE activations come last, in a chunk with no choices and the `millm` object.
    """
    finished = completion_tokens = 0
    captured = []
    try:
        for choices in opening:
            yield sse(chunk(choices))
        async for event in stream.events():
            if isinstance(event, TextDelta):
                for choice in delta(event.row, event.text):
                    yield sse(chunk([choice]))
            elif isinstance(event, RowFinished):
                finished += 1
                completion_tokens += event.completion_tokens
                last = finished == rows and not include_usage
                extra = {"usage": usage(prompt_tokens, completion_tokens)} if last else {}
                closing = finish(event.row, event.finish_reason)
                for choice in closing[:-1]:
                    yield sse(chunk([choice]))
                yield sse(chunk([closing[-1]], **extra))
            elif isinstance(event, ResidualsRead):
                captured.append(event)
            elif isinstance(event, JobFailed):
                yield sse(error_body(event.error))
                break
        else:
            if include_usage:
                yield sse(chunk([], usage=usage(prompt_tokens, completion_tokens)))
            blocks = read_blocks(read, captured)
            if blocks:
                yield sse(chunk([], **blocks))
        yield sse("[DONE]")
    finally:
        stream.cancel()


def chat_chunks(stream: JobStream, meta: ResponseMeta, prompt_tokens: int, rows: int, include_usage: bool, read=None,
                tools: ToolPlan | None = None):
    """The chat stream: a role chunk first, then content deltas (tool calls as OpenAI streams them) and the finish chunk."""

    def chunk(choices, **extra):
        return {
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": choices,
            **extra,
        }

    def content(row, text):
        return {"index": row, "delta": {"content": text}, "logprobs": None, "finish_reason": None}

    def closing(row, reason):
        return {"index": row, "delta": {}, "logprobs": None, "finish_reason": reason}

    role = [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    if tools is None:
        delta = lambda row, text: [content(row, text)]  # noqa: E731
        finish = lambda row, reason: [closing(row, reason)]  # noqa: E731
    else:
        delta, finish = tool_stream(tools, content, closing)
    return stream_frames(stream, prompt_tokens, rows, include_usage, chunk, delta, finish, opening=[role], read=read)


def tool_stream(tools: ToolPlan, content, closing):
    """delta/finish for a stream with tools: text streams until a call may begin (auto) or not at
    all (a forced call); at the end, calls go out as `delta.tool_calls` chunks, OpenAI's way."""
    texts: dict[int, str] = {}
    holds: dict[int, CallHoldback] = {}

    def delta(row, text):
        texts[row] = texts.get(row, "") + text
        if tools.constrained:
            return []
        passed = holds.setdefault(row, CallHoldback()).push(text) if tools.offered else text
        return [content(row, passed)] if passed else []

    def finish(row, reason):
        read = read_answer(tools, texts.pop(row, ""), reason, row)
        held = holds.pop(row, CallHoldback()).flush()
        choices = []
        if not read.calls:
            # What has not been streamed yet: the held tail (auto), or a cut forced call's text.
            rest = (read.content or "") if tools.constrained else held
            if rest:
                choices.append(content(row, rest))
        for k, call in enumerate(read.calls):
            piece = {"index": k, "id": call["id"], "type": "function", "function": call["function"]}
            choices.append({"index": row, "delta": {"tool_calls": [piece]}, "logprobs": None, "finish_reason": None})
        return [*choices, closing(row, read.finish_reason(reason))]

    return delta, finish


def completion_chunks(stream: JobStream, meta: ResponseMeta, prompt_tokens: int, rows: int, include_usage: bool, read=None):
    """The text-completion stream: text deltas per choice index, then finish chunks."""

    def chunk(choices, **extra):
        return {"id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model, "choices": choices, **extra}

    def delta(row, text):
        return [{"index": row, "text": text, "logprobs": None, "finish_reason": None}]

    def finish(row, reason):
        return [{"index": row, "text": "", "logprobs": None, "finish_reason": reason}]

    return stream_frames(stream, prompt_tokens, rows, include_usage, chunk, delta, finish, read=read)
