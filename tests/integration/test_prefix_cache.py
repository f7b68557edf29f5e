"""The prefix cache and chunked prefill on tiny float32 models: a row served from cached KV gives
the tokens and logits (1e-5) of the same row computed whole, for plain, steered, operated,
seeded and batched rows and on sliding-window layers; steering is part of the key; eviction
under a tiny budget corrupts nothing; a long prompt joins a running batch a chunk at a time."""

from __future__ import annotations

import threading

import pytest
import torch

from millm.engine.generate import Lane
from millm.engine.jobs import GenerationJob, ResidualRead, ResidualsRead, RowFinished, RowSpec
from millm.engine.prefix_cache import BLOCK_TOKENS, PrefixCache, keyed, steering_key
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.engine.scheduler import Scheduler
from millm.interp.operators import cap
from tests.conftest import load_tiny
from tests.integration.engine_helpers import Outcome, prompt_ids, row
from tests.support import tiny_models

TEXT = "A river runs through the old town and the bridges are made of stone, and every morning the baker opens"
BIG = 1 << 30


class Trace:
    """One job run through a lane step by step: its outcome, and the logits before every sample."""

    def __init__(self, lm, cache: PrefixCache | None, rows: list[RowSpec]):
        self.outcome = Outcome()
        lane = Lane(lm, cache)
        with torch.inference_mode():
            lane.join(GenerationJob(rows=rows, emit=self.outcome.record))
            self.states = list(lane.rows)
            self.logits = []
            while lane.rows:
                self.logits.append(lane.logits.clone())
                lane.step()
            lm.residual.clear()
        self.cached = {
            e.row: e.cached_tokens for e in self.outcome.events if isinstance(e, RowFinished)
        }

    @property
    def texts(self) -> dict[int, str]:
        return self.outcome.texts


def assert_same(hit: Trace, whole: Trace) -> None:
    assert hit.texts == whole.texts
    assert len(hit.logits) == len(whole.logits)
    for a, b in zip(hit.logits, whole.logits, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), float((a - b).abs().max())


def prompt(lm, text: str = TEXT) -> list[int]:
    ids = prompt_ids(lm, text)
    assert len(ids) > 2 * BLOCK_TOKENS + 1  # at least two whole blocks can be reused
    return ids


def edit_of(lm, seed: int = 0) -> ResidualEdit:
    torch.manual_seed(seed)
    return ResidualEdit(((1, 2 * torch.randn(lm.model.config.hidden_size)),))


KINDS = {
    "plain": lambda lm, p: [row(p, 12)],
    "steered": lambda lm, p: [row(p, 12, edit=edit_of(lm))],
    "operated": lambda lm, p: [
        row(p, 12, edit=ResidualEdit((), ((1, cap(torch.ones(lm.model.config.hidden_size), 0.1)),)))
    ],
    "seeded": lambda lm, p: [row(p, 12, sampling=SamplingParams(temperature=1.0), seed=7)],
    "batched": lambda lm, p: [
        row(p, 12),
        row(p[:-3], 9, edit=edit_of(lm)),
        row(prompt_ids(lm, "Once upon a time"), 6),
    ],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cache_hit_gives_the_tokens_and_logits_of_a_whole_prefill(llama_lm, kind):
    p = prompt(llama_lm)
    whole = Trace(llama_lm, None, KINDS[kind](llama_lm, p))
    cache = PrefixCache(BIG)
    first = Trace(llama_lm, cache, KINDS[kind](llama_lm, p))
    again = Trace(
        llama_lm, cache, KINDS[kind](llama_lm, p)
    )  # new edit objects, equal content: a hit
    assert first.cached[0] == 0 and again.cached[0] > 0
    assert again.cached[0] % BLOCK_TOKENS == 0 and again.cached[0] < len(p)
    assert_same(first, whole)
    assert_same(again, whole)


def test_a_steered_row_never_reuses_unsteered_kv_nor_another_steering(llama_lm):
    p = prompt(llama_lm)
    cache = PrefixCache(BIG)
    Trace(llama_lm, cache, [row(p, 8)])
    hits = cache.counters.hits
    for seed in (1, 2):
        steered = Trace(llama_lm, cache, [row(p, 8, edit=edit_of(llama_lm, seed))])
        assert steered.cached[0] == 0 and cache.counters.hits == hits
        assert_same(steered, Trace(llama_lm, None, [row(p, 8, edit=edit_of(llama_lm, seed))]))
    assert (
        Trace(llama_lm, cache, [row(p, 8, edit=edit_of(llama_lm, 2))]).cached[0] > 0
    )  # the same steering again does hit
    assert Trace(llama_lm, cache, [row(p, 8)]).cached[0] > 0  # and unsteered rows still share


def test_steering_keys_follow_content_and_refuse_unkeyed_operations(llama_lm):
    d = llama_lm.model.config.hidden_size
    assert steering_key(None) == ()
    assert steering_key(edit_of(llama_lm, 3)) == steering_key(edit_of(llama_lm, 3))
    assert steering_key(edit_of(llama_lm, 3)) != steering_key(edit_of(llama_lm, 4))
    assert steering_key(ResidualEdit((), ((1, cap(torch.ones(d), 0.1)),))) != steering_key(
        ResidualEdit((), ((1, cap(torch.ones(d), 0.2)),))
    )
    unkeyed = ResidualEdit((), ((1, lambda x: x * 0.5),))
    assert steering_key(unkeyed) is None
    assert steering_key(ResidualEdit((), ((1, keyed(lambda x: x * 0.5, "half")),))) == (
        (),
        ((1, "half"),),
    )
    cache = PrefixCache(BIG)
    p = prompt(llama_lm)
    for _ in range(2):
        assert Trace(llama_lm, cache, [row(p, 4, edit=unkeyed)]).cached[0] == 0
    assert cache.counters.lookups == 0 and cache.bytes == 0


def test_a_finished_answer_is_reused_by_the_next_turn(llama_lm):
    p = prompt(llama_lm)
    cache = PrefixCache(BIG)
    first = Trace(llama_lm, cache, [row(p, 40)])
    generated = first.states[0].generated
    assert len(generated) == 40
    fed = p + generated[:-1]  # the last sampled token was never fed
    turn = fed + prompt_ids(llama_lm, " And then?")[1:]
    second = Trace(llama_lm, cache, [row(turn, 6)])
    assert second.cached[0] >= len(fed) - BLOCK_TOKENS + 1 and second.cached[0] > len(p)
    assert_same(second, Trace(llama_lm, None, [row(turn, 6)]))


def test_reads_of_prompt_positions_are_recomputed_and_completion_reads_are_identical(llama_lm):
    p = prompt(llama_lm)
    cache = PrefixCache(BIG)
    Trace(llama_lm, cache, [row(p, 6)])

    def read(positions) -> RowSpec:
        return RowSpec(
            prompt_ids=tuple(p),
            sampling=SamplingParams(temperature=0.0),
            max_tokens=6,
            reads=(ResidualRead(1, False, positions, "activations"),),
        )

    def captured(trace: Trace) -> ResidualsRead:
        return next(e for e in trace.outcome.events if isinstance(e, ResidualsRead))

    for positions, reused in (
        ("prompt", False),
        ("all", False),
        ((20, 30), True),
        ("completion", True),
        ("last", True),
    ):
        hit, whole = (
            Trace(llama_lm, cache, [read(positions)]),
            Trace(llama_lm, None, [read(positions)]),
        )
        assert (hit.cached[0] > 0) is reused, positions
        if isinstance(positions, tuple):
            assert hit.cached[0] <= positions[0]
        assert captured(hit).positions == captured(whole).positions
        assert torch.allclose(captured(hit).residuals, captured(whole).residuals, atol=1e-5, rtol=0)


def test_a_tiny_budget_evicts_without_corrupting_running_rows(llama_lm):
    texts = [
        TEXT,
        TEXT + " a loaf",
        "Seven apples were on the table near the window of the small kitchen at the end of the hall",
    ]
    specs = [row(prompt(llama_lm, text), 10) for text in texts]
    solo = [Trace(llama_lm, None, [spec]).texts[0] for spec in specs]
    probe = PrefixCache(BIG)
    Trace(llama_lm, probe, [specs[0]])
    block = probe.bytes // probe.counters.tokens_stored * BLOCK_TOKENS
    scheduler = Scheduler(
        llama_lm, 64, batching=True, max_batch=8, prefix_cache_bytes=2 * block
    )  # every prompt evicts
    cache = scheduler.prefix_cache
    assert cache is not None
    try:
        results = []
        for _ in range(3):
            outcomes = [Outcome() for _ in specs]
            done = [threading.Event() for _ in specs]
            for spec, outcome, event in zip(specs, outcomes, done, strict=True):
                scheduler.submit(
                    GenerationJob(
                        rows=[spec],
                        emit=lambda e, o=outcome, d=event: (
                            o.record(e),
                            isinstance(e, RowFinished) and d.set(),
                        ),
                    )
                )
            assert all(event.wait(60) for event in done)
            results.append([outcome.texts[0] for outcome in outcomes])
    finally:
        scheduler.shutdown(timeout=30)
    assert results == [solo] * 3
    assert cache.counters.evictions > 0 and cache.bytes <= 2 * block


def test_sliding_window_layers_restore_exactly(tmp_path):
    tiny_models.build_tokenizer(tmp_path / "tokenizer")
    lm = load_tiny(
        tiny_models.build_gemma3(tmp_path / "gemma3", tmp_path / "tokenizer"), tmp_path / "home"
    )
    assert (
        lm.runner.window is not None and lm.runner.window < 2 * BLOCK_TOKENS
    )  # the prefix is longer than the window
    p = prompt(lm)
    cache = PrefixCache(BIG)
    Trace(lm, cache, [row(p, 10)])
    again = Trace(lm, cache, [row(p, 10)])
    assert again.cached[0] >= 2 * BLOCK_TOKENS
    assert_same(again, Trace(lm, None, [row(p, 10)]))


def test_a_long_prompt_joins_a_chunk_at_a_time_while_the_batch_streams(llama_lm):
    long_prompt = prompt(llama_lm, TEXT + " " + TEXT)
    short = prompt_ids(llama_lm, "Once upon a time")
    solo_long = Trace(llama_lm, None, [row(long_prompt, 5)]).texts[0]
    solo_short = Trace(llama_lm, None, [row(short, 60)]).texts[0]
    scheduler = Scheduler(
        llama_lm, 64, batching=True, max_batch=8, prefix_cache_bytes=0, prefill_chunk=16
    )

    def sampled() -> int:
        """Tokens the running row has sampled so far (read on the scheduler thread, or between its steps)."""
        lane = scheduler._batch_lane
        return len(lane.rows[0].generated) if lane is not None and lane.rows else 0

    marks: dict[str, int] = {}

    def watch(outcome: Outcome, done: threading.Event, name: str | None = None):
        def emit(event):
            outcome.record(event)
            if name is not None and name not in marks:
                marks[name] = sampled()  # the joining row's first event: its prefill is over
            if isinstance(event, RowFinished):
                done.set()

        return emit

    try:
        running, joining = Outcome(), Outcome()
        running_done, joining_done = threading.Event(), threading.Event()
        scheduler.submit(GenerationJob(rows=[row(short, 60)], emit=watch(running, running_done)))
        while sampled() < 2:
            threading.Event().wait(0.001)
        marks["submitted"] = sampled()
        scheduler.submit(
            GenerationJob(rows=[row(long_prompt, 5)], emit=watch(joining, joining_done, "joined"))
        )
        assert joining_done.wait(60) and running_done.wait(60)
    finally:
        scheduler.shutdown(timeout=30)
    assert joining.texts[0] == solo_long and running.texts[0] == solo_short
    chunks = -(-len(long_prompt) // 16)
    # The running row samples a token after every chunk (give or take the step the job was
    # admitted in): it never waits for the whole prefill.
    assert marks["joined"] - marks["submitted"] >= chunks - 1, (chunks, marks)


def test_a_scoring_job_that_reuses_prefixes_gives_a_whole_passs_logits(llama_lm):
    """Many prompts sharing a long start (a scorer's few-shot chat): each scored from the cached
    start, a few prompts of different lengths a pass, gives the next-token logits of a pass over
    the whole prompt (1e-5), and a job that does not ask never touches the cache."""
    from millm.engine.jobs import ScoresReady, ScoringJob
    from millm.engine.scoring import REUSE_ROWS, reuse_groups, run_scoring

    shared = prompt(llama_lm)
    tails = ["the cat", "a dog ran", "x", *(f"number {n} of them" for n in range(REUSE_ROWS))]
    prompts = [shared + prompt_ids(llama_lm, tail)[1:] for tail in tails]
    # The first alone (it stores the shared start), then passes of REUSE_ROWS, the last shorter.
    assert [len(g) for g in reuse_groups(len(prompts))] == [
        1,
        REUSE_ROWS,
        len(prompts) - 1 - REUSE_ROWS,
    ]

    def scored(cache, reuse):
        answers: list[ScoresReady] = []
        run_scoring(
            llama_lm, ScoringJob(prompts=prompts, emit=answers.append, reuse_prefix=reuse), cache
        )
        return answers[0].logits

    whole = scored(None, False)
    untouched = PrefixCache(BIG)
    scored(untouched, False)
    assert untouched.counters.lookups == 0 and untouched.bytes == 0
    cache = PrefixCache(BIG)
    reused = scored(cache, True)
    others = len(prompts) - 1
    assert (
        cache.counters.hits == others
    )  # the first prompt stored the shared blocks, the others took them
    # A row keeps what every row of its pass can skip together: its tail is at most one block
    # longer than the longest tail's in the same pass, so it gives up at most that.
    blocks = (len(shared) // BLOCK_TOKENS) * BLOCK_TOKENS
    assert others * (blocks - BLOCK_TOKENS) <= cache.counters.tokens_reused <= others * blocks
    for a, b in zip(reused, whole, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=0), float((a - b).abs().max())
