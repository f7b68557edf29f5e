"""Scoring mode on /v1/completions and /v1/chat/completions: next-token log-probabilities, unsteered
(but for a variant whose scoring is steered: kernel/variants/naming.py), and the answers it makes (a
completion per prompt, with echo its tokens scored too; a chat choice per conversation).

The rules of the API page's "Scoring mode" and "Chat scoring" sections: one forward pass per
prompt and nothing generated; max_tokens 1 and n 1; normalisation over allowed_token_ids;
OpenAI's legacy shape for completions and its chat shape (with bytes) for chat.
"""

from __future__ import annotations

from millm.engine.jobs import Ranking, ScoresReady, ScoringJob, TokenDrawn, pack_scoring
from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit
from millm.engine.scoring import Echoed, Scored, check_reported
from millm.errors import ContextLengthExceeded, InvalidScoringRequest, MillmError
from millm.v1.objects import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    Usage,
)
from millm.v1.serving.activations import ActivationRead
from millm.v1.serving.answers import Echo, Meta, millm_block
from millm.v1.serving.generation import answered
from millm.v1.serving.parts import ServingParts
from millm.v1.serving.protocol import ChatCompletionRequest, CompletionRequest
from millm.v1.serving.replies import Admitted, Reply
from millm.v1.token_logprobs import TokenWords, joined, token_text


def check_allowed(lm: LoadedModel, allowed: list[int] | None) -> list[int] | None:
    """Every allowed id must be in the vocabulary; duplicates are scored once."""
    if allowed is None:
        return None
    bad = [t for t in allowed if not 0 <= t < lm.vocab_size]
    if bad:
        raise InvalidScoringRequest(
            f"allowed_token_ids holds ids outside the vocabulary (0..{lm.vocab_size - 1}): "
            f"{bad[:10]}",
            param="allowed_token_ids",
        )
    return list(dict.fromkeys(allowed))


def check_scored_lengths(lm: LoadedModel, prompts: list[list[int]], param: str) -> None:
    """A scored prompt must fit the context window (the next token needs no position of its own)."""
    for index, prompt in enumerate(prompts):
        if len(prompt) > lm.context_length:
            where = param if len(prompts) == 1 else f"{param}[{index}]"
            raise ContextLengthExceeded(
                limit=lm.context_length, prompt_tokens=len(prompt), max_tokens=0, param=where
            )


async def score_and_read(
    state: ServingParts,
    prompts: list[list[int]],
    ranking: Ranking,
    reads: tuple = (),
    echo: bool = False,
    edit: ResidualEdit | None = None,
) -> ScoresReady:
    """Each prompt's ranked next token (ranked on the scheduler thread), with `echo` its own
    tokens scored too, and what `reads` captured of its pass; unsteered unless `edit` (a variant
    whose scoring is steered)."""
    return await answered(
        state.switch.submit,
        ScoresReady,
        lambda emit: ScoringJob(
            prompts=prompts,
            emit=emit,
            reads=reads,
            ranking=ranking,
            echo=echo,
            edit=edit,
            pack=pack_scoring.get(),  # a batch's line with `pack` (the engine packs plain ones)
        ),
    )


def completion_choice(
    lm: LoadedModel,
    scored: Scored,
    index: int,
    prompt_text: str,
    logprobs: int | None,
    allowed,
    by_id: bool,
) -> CompletionChoice:
    """A legacy completions choice: the chosen token's text and, when asked, OpenAI's logprobs
    object."""
    text = token_text(lm, scored.chosen)
    if logprobs is None:
        return CompletionChoice(index=index, text=text, finish_reason="length")
    # With allowed_token_ids every listed token is returned; otherwise the `logprobs` most probable.
    shown = len(scored.ranked) if allowed else logprobs
    check_reported(scored, shown)
    detail = TokenWords(lm, by_id).legacy([scored_token(index, scored, shown)], len(prompt_text))
    return CompletionChoice(index=index, text=text, logprobs=detail, finish_reason="length")


def scored_token(row: int, scored: Scored, shown: int) -> TokenDrawn:
    """A scored next token as a drawn one, with its first `shown` alternatives."""
    return TokenDrawn(row, scored.chosen, scored.chosen_logprob, tuple(scored.ranked[:shown]))


def echoed_choice(
    lm: LoadedModel,
    scored: Scored,
    index: int,
    prompt: tuple[list[int], str, Echoed | None],
    logprobs: int | None,
    by_id: bool,
    generated: bool,
) -> CompletionChoice:
    """A legacy completions choice with echo: the prompt's text, then the next token's when one
    was asked for (max_tokens 1); with logprobs, the prompt's tokens scored (null for the first,
    which nothing predicts) and then the next token's, offsets counting the echoed text."""
    ids, prompt_text, echoed = prompt
    text = prompt_text + (token_text(lm, scored.chosen) if generated else "")
    if logprobs is None or echoed is None:
        return CompletionChoice(index=index, text=text, finish_reason="length")
    words = TokenWords(lm, by_id)
    detail = words.prompt(ids, echoed)
    if generated:
        check_reported(scored, logprobs)
        drawn = scored_token(index, scored, logprobs)
        detail = joined(detail, words.legacy([drawn], len(prompt_text)))
    return CompletionChoice(index=index, text=text, logprobs=detail, finish_reason="length")


def chat_choice(
    lm: LoadedModel,
    scored: Scored,
    index: int,
    logprobs: bool,
    top_logprobs: int | None,
    by_id: bool,
) -> ChatChoice:
    """A chat choice: the chosen token as the message and, with logprobs: true, OpenAI's chat
    logprobs."""
    text = token_text(lm, scored.chosen)
    message = AssistantMessage(content=text)
    if not logprobs:
        return ChatChoice(index=index, message=message, finish_reason="length")
    shown = min(top_logprobs or 0, len(scored.ranked))
    check_reported(scored, shown)
    words = TokenWords(lm, by_id)
    chosen = words.chat_entry(scored.chosen, scored.chosen_logprob, scored.ranked[:shown])
    return ChatChoice(
        index=index,
        message=message,
        logprobs=ChatLogprobs(content=[chosen]),
        finish_reason="length",
    )


def logprob_words(admitted: Admitted) -> TokenWords | None:
    """How a generation's tokens are said in its logprobs, when it asked for them (None if not)."""
    if admitted.body.drawn_logprobs is None:
        return None
    return TokenWords(admitted.lm, bool(admitted.body.return_tokens_as_token_ids))


async def echoed_prompts(
    state: ServingParts,
    body: CompletionRequest,
    prompts_and_texts: tuple[list[list[int]], list[str]],
    words: TokenWords | None,
    edit: ResidualEdit | None,
) -> list[Echo]:
    """What echo puts before each generated completion: the prompt's text and, with logprobs, its
    tokens scored by one pass (at the request's temperature, 0: unscaled), unsteered unless
    `edit`."""
    prompts, texts = prompts_and_texts
    if words is None:
        return [Echo(text) for text in texts]
    ranking = Ranking(None, body.scoring_temperature, body.logprobs or 0)
    answered = await score_and_read(state, prompts, ranking, echo=True, edit=edit)
    return [
        Echo(text, words.prompt(ids, echoed))
        for ids, text, echoed in zip(prompts, texts, answered.echoed, strict=True)
    ]


def engine_reads(read: ActivationRead | None) -> tuple:
    """The request's SAE read as the engine takes it (none, or one)."""
    return (read.engine_read(),) if read is not None else ()


async def score_completions(
    state: ServingParts, admitted: Admitted, texts: list[str], meta: Meta
) -> Reply:
    """Score each prompt's next token (and with echo its own tokens) in one job, unsteered unless
    the report's plan steers it (a variant whose scoring is steered); `texts` are the prompts'
    texts."""
    lm, prompts, report, read = admitted.lm, admitted.prompts, admitted.report, admitted.read
    body = admitted.body
    assert isinstance(body, CompletionRequest)  # text scoring: chat's is score_chat
    check_scored_lengths(lm, prompts, "prompt")
    allowed = check_allowed(lm, body.allowed_token_ids)
    ranking = Ranking(
        tuple(allowed) if allowed else None,
        body.scoring_temperature,
        None if allowed else body.logprobs or 0,
    )
    echo = bool(body.echo)
    answered = await score_and_read(
        state,
        prompts,
        ranking,
        engine_reads(read),
        echo and body.logprobs is not None,
        report.plan.edit,
    )
    by_id = bool(body.return_tokens_as_token_ids)
    generated = 0 if body.token_budget == 0 else 1
    choices = [
        echoed_choice(
            lm,
            scored,
            i,
            (prompts[i], texts[i], answered.echoed[i] if answered.echoed else None),
            body.logprobs,
            by_id,
            generated=bool(generated),
        )
        if echo
        else completion_choice(lm, scored, i, texts[i], body.logprobs, allowed, by_id)
        for i, scored in enumerate(answered.scored)
    ]
    scored_body = Completion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        system_fingerprint=meta.fingerprint,
        choices=choices,
        usage=Usage.of(sum(map(len, prompts)), generated * len(prompts)),
        millm=millm_block(read, answered.reads, unsteered=report.plan.edit is None),
    )
    return Reply(report, body=scored_body)


async def score_chat(state: ServingParts, admitted: Admitted, meta: Meta) -> Reply:
    """Score each conversation one at a time; a failing one fails the request, naming its index."""
    lm, prompts, report, read = admitted.lm, admitted.prompts, admitted.report, admitted.read
    body = admitted.body
    assert isinstance(body, ChatCompletionRequest)  # chat's scoring: the other is score_completions
    allowed = check_allowed(lm, body.allowed_token_ids)
    ranking = Ranking(
        tuple(allowed) if allowed else None,
        body.scoring_temperature,
        None if allowed else body.top_logprobs or 0,
    )
    choices, captured = [], []
    for index, prompt in enumerate(prompts):
        try:
            where = "messages" if index == 0 else f"extra_messages[{index - 1}]"
            check_scored_lengths(lm, [prompt], where)
            answered = await score_and_read(
                state, [prompt], ranking, engine_reads(read), edit=report.plan.edit
            )
            captured += answered.reads
            by_id = bool(body.return_tokens_as_token_ids)
            choices.append(
                chat_choice(
                    lm, answered.scored[0], index, bool(body.logprobs), body.top_logprobs, by_id
                )
            )
        except MillmError as exc:
            if len(prompts) > 1:
                exc.message = (
                    f"conversation {index} "
                    f"({'messages' if index == 0 else f'extra_messages[{index - 1}]'}): "
                    f"{exc.message}"
                )
            raise
    scored = ChatCompletion(
        id=meta.id,
        created=meta.created,
        model=meta.model,
        system_fingerprint=meta.fingerprint,
        choices=choices,
        usage=Usage.of(sum(map(len, prompts)), len(prompts)),
        millm=millm_block(read, captured, unsteered=report.plan.edit is None),
    )
    return Reply(report, body=scored)
