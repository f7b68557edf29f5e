"""The prefix cache and chunked prefill on tiny float32 models, on the transformers engine and on
llama.cpp (its F32 GGUF file): a row served from cached KV gives the tokens and logits (1e-5;
llama.cpp 1e-4) of the same row computed whole, for plain, steered, operated, seeded and batched
rows and on sliding-window layers; steering is part of the key; eviction under a tiny budget
corrupts nothing; a long prompt joins a running batch a chunk at a time."""

from __future__ import annotations

import threading

import pytest
import torch

from millm.engine.generate import Lane
from millm.engine.jobs import GenerationJob, ResidualRead, ResidualsRead, RowFinished, RowSpec
from millm.engine.prefix_cache import BLOCK_TOKENS, PrefixCache, cache_for, keyed, steering_key
from millm.engine.residual import ResidualEdit
from millm.engine.sampling import SamplingParams
from millm.engine.scheduler import Scheduler
from millm.interp.operators import cap
from tests.conftest import load_tiny
from tests.integration.engine_helpers import Outcome, prompt_ids, row
from tests.support import tiny_models

TEXT = (
    "A river runs through the old town and the bridges are made of stone, and every morning "
    "the baker opens"
)
BIG = 1 << 30
ENGINES = ["transformers", "llama.cpp"]


@pytest.fixture(params=ENGINES)
def lm(request):
    """The tiny Llama on each engine (llama.cpp: its F32 GGUF file, float32 keys and values)."""
    return request.getfixturevalue("llama_lm" if request.param == "transformers" else "cpp_lm")


def new_cache(lm, budget: int = BIG) -> PrefixCache:
    cache = cache_for(lm.runner, budget)
    assert cache is not None
    return cache


def tolerance(lm) -> float:
    """llama.cpp computes a restored row's remaining positions in a narrower batch than a whole
    prefill, which rounds differently in the last bits."""
    return 1e-4 if lm.engine == "llama.cpp" else 1e-5


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


def assert_same(hit: Trace, whole: Trace, atol: float = 1e-5) -> None:
    assert hit.texts == whole.texts
    assert len(hit.logits) == len(whole.logits)
    for a, b in zip(hit.logits, whole.logits, strict=True):
        assert torch.allclose(a, b, atol=atol, rtol=0), float((a - b).abs().max())


def prompt(lm, text: str = TEXT) -> list[int]:
    ids = prompt_ids(lm, text)
    assert len(ids) > 2 * BLOCK_TOKENS + 1  # at least two whole blocks can be reused
    return ids


def edit_of(lm, seed: int = 0) -> ResidualEdit:
    torch.manual_seed(seed)
    return ResidualEdit(((1, 2 * torch.randn(lm.config.hidden_size)),))


KINDS = {
    "plain": lambda lm, p: [row(p, 12)],
    "steered": lambda lm, p: [row(p, 12, edit=edit_of(lm))],
    "operated": lambda lm, p: [
        row(p, 12, edit=ResidualEdit((), ((1, cap(torch.ones(lm.config.hidden_size), 0.1)),)))
    ],
    "seeded": lambda lm, p: [row(p, 12, sampling=SamplingParams(temperature=1.0), seed=7)],
    "batched": lambda lm, p: [
        row(p, 12),
        row(p[:-3], 9, edit=edit_of(lm)),
        row(prompt_ids(lm, "Once upon a time"), 6),
    ],
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cache_hit_gives_the_tokens_and_logits_of_a_whole_prefill(lm, kind):
    p = prompt(lm)
    whole = Trace(lm, None, KINDS[kind](lm, p))
    cache = new_cache(lm)
    first = Trace(lm, cache, KINDS[kind](lm, p))
    again = Trace(lm, cache, KINDS[kind](lm, p))  # new edit objects, equal content: a hit
    if kind == "seeded" and not lm.restores_exactly:  # a seed promises the same text, warm or cold
        assert first.cached[0] == again.cached[0] == 0
    else:
        assert first.cached[0] == 0 and again.cached[0] > 0
        assert again.cached[0] % BLOCK_TOKENS == 0 and again.cached[0] < len(p)
    assert_same(first, whole, tolerance(lm))
    assert_same(again, whole, tolerance(lm))


def test_a_steered_row_never_reuses_unsteered_kv_nor_another_steering(lm):
    p = prompt(lm)
    cache = new_cache(lm)
    Trace(lm, cache, [row(p, 8)])
    hits = cache.counters.hits
    for seed in (1, 2):
        steered = Trace(lm, cache, [row(p, 8, edit=edit_of(lm, seed))])
        assert steered.cached[0] == 0 and cache.counters.hits == hits
        assert_same(steered, Trace(lm, None, [row(p, 8, edit=edit_of(lm, seed))]), tolerance(lm))
    # the same steering again does hit
    assert Trace(lm, cache, [row(p, 8, edit=edit_of(lm, 2))]).cached[0] > 0
    assert Trace(lm, cache, [row(p, 8)]).cached[0] > 0  # and unsteered rows still share


def test_steering_keys_follow_content_and_refuse_unkeyed_operations(lm):
    d = lm.config.hidden_size
    assert steering_key(None) == ()
    assert steering_key(edit_of(lm, 3)) == steering_key(edit_of(lm, 3))
    assert steering_key(edit_of(lm, 3)) != steering_key(edit_of(lm, 4))
    assert steering_key(ResidualEdit((), ((1, cap(torch.ones(d), 0.1)),))) != steering_key(
        ResidualEdit((), ((1, cap(torch.ones(d), 0.2)),))
    )
    unkeyed = ResidualEdit((), ((1, lambda x: x * 0.5),))
    assert steering_key(unkeyed) is None
    assert steering_key(ResidualEdit((), ((1, keyed(lambda x: x * 0.5, "half")),))) == (
        (),
        ((1, "half"),),
    )
    cache = new_cache(lm)
    p = prompt(lm)
    for _ in range(2):
        assert Trace(lm, cache, [row(p, 4, edit=unkeyed)]).cached[0] == 0
    assert cache.counters.lookups == 0 and cache.bytes == 0


def test_a_finished_answer_is_reused_by_the_next_turn(lm):
    p = prompt(lm)
    cache = new_cache(lm)
    first = Trace(lm, cache, [row(p, 40)])
    generated = first.states[0].generated
    assert len(generated) == 40
    fed = p + generated[:-1]  # the last sampled token was never fed
    turn = fed + prompt_ids(lm, " And then?")[1:]
    second = Trace(lm, cache, [row(turn, 6)])
    assert second.cached[0] >= len(fed) - BLOCK_TOKENS + 1 and second.cached[0] > len(p)
    assert_same(second, Trace(lm, None, [row(turn, 6)]), tolerance(lm))


def test_reads_of_prompt_positions_are_recomputed_and_completion_reads_are_identical(lm):
    p = prompt(lm)
    cache = new_cache(lm)
    Trace(lm, cache, [row(p, 6)])

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
            Trace(lm, cache, [read(positions)]),
            Trace(lm, None, [read(positions)]),
        )
        assert (hit.cached[0] > 0) is reused, positions
        if isinstance(positions, tuple):
            assert hit.cached[0] <= positions[0]
        assert captured(hit).positions == captured(whole).positions
        assert torch.allclose(
            captured(hit).residuals, captured(whole).residuals, atol=tolerance(lm), rtol=0
        )


def test_a_tiny_budget_evicts_without_corrupting_running_rows(lm):
    texts = [
        TEXT,
        TEXT + " a loaf",
        "Seven apples were on the table near the window of the small kitchen at the end of the "
        "hall",
    ]
    specs = [row(prompt(lm, text), 10) for text in texts]
    solo = [Trace(lm, None, [spec]).texts[0] for spec in specs]
    probe = new_cache(lm)
    Trace(lm, probe, [specs[0]])
    block = probe.bytes // probe.counters.tokens_stored * BLOCK_TOKENS
    # every prompt evicts
    scheduler = Scheduler(lm, 64, batching=True, max_batch=8, prefix_cache_bytes=2 * block)
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
    # the prefix is longer than the window
    assert lm.runner.window is not None and lm.runner.window < 2 * BLOCK_TOKENS
    p = prompt(lm)
    cache = new_cache(lm)
    Trace(lm, cache, [row(p, 10)])
    again = Trace(lm, cache, [row(p, 10)])
    assert again.cached[0] >= 2 * BLOCK_TOKENS
    assert_same(again, Trace(lm, None, [row(p, 10)]))


def test_a_long_prompt_joins_a_chunk_at_a_time_while_the_batch_streams(lm):
    long_prompt = prompt(lm, TEXT + " " + TEXT)
    short = prompt_ids(lm, "Once upon a time")
    solo_long = Trace(lm, None, [row(long_prompt, 5)]).texts[0]
    solo_short = Trace(lm, None, [row(short, 60)]).texts[0]
    scheduler = Scheduler(
        lm, 64, batching=True, max_batch=8, prefix_cache_bytes=0, prefill_chunk=16
    )

    def sampled() -> int:
        """Tokens the running row has sampled so far (read on the scheduler thread, or between
        its steps)."""
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


def test_a_scoring_job_that_reuses_prefixes_gives_a_whole_passs_logits(lm):
    """Many prompts sharing a long start (a scorer's few-shot chat): each scored from the cached
    start, a few prompts of different lengths a pass, gives the next-token logits of a pass over
    the whole prompt (1e-5), and a job that does not ask never touches the cache."""
    from millm.engine.jobs import ScoresReady, ScoringJob
    from millm.engine.scoring import REUSE_ROWS, reuse_groups, run_scoring

    shared = prompt(lm)
    tails = ["the cat", "a dog ran", "x", *(f"number {n} of them" for n in range(REUSE_ROWS))]
    prompts = [shared + prompt_ids(lm, tail)[1:] for tail in tails]
    # The first alone (it stores the shared start), then passes of REUSE_ROWS, the last shorter.
    assert [len(g) for g in reuse_groups(len(prompts))] == [
        1,
        REUSE_ROWS,
        len(prompts) - 1 - REUSE_ROWS,
    ]

    def scored(cache, reuse):
        answers: list[ScoresReady] = []
        run_scoring(lm, ScoringJob(prompts=prompts, emit=answers.append, reuse_prefix=reuse), cache)
        return answers[0].logits

    whole = scored(None, False)
    untouched = new_cache(lm)
    scored(untouched, False)
    assert untouched.counters.lookups == 0 and untouched.bytes == 0
    cache = new_cache(lm)
    reused = scored(cache, True)
    others = len(prompts) - 1
    # the first prompt stored the shared blocks, the others took them
    assert cache.counters.hits == others
    # A row keeps what every row of its pass can skip together: its tail is at most one block
    # longer than the longest tail's in the same pass, so it gives up at most that.
    blocks = (len(shared) // BLOCK_TOKENS) * BLOCK_TOKENS
    assert others * (blocks - BLOCK_TOKENS) <= cache.counters.tokens_reused <= others * blocks
    for a, b in zip(reused, whole, strict=True):
        assert torch.allclose(a, b, atol=tolerance(lm), rtol=0), float((a - b).abs().max())


def test_llamacpp_keeps_copies_and_leaves_the_window_and_sequences_to_rows(tiny_gguf, tmp_path):
    """On llama.cpp a cached block is a copy of its KV cells in host memory: the cache holds no
    sequence and no cell of the window, so with two sequences and a 256-position window full of
    cached prefixes two rows still run side by side and one row still fills the whole window,
    each giving the tokens of a run that never cached."""
    lm = load_tiny(tiny_gguf, tmp_path, engine="llama.cpp", sequences=2, max_model_len=128)
    plain = load_tiny(tiny_gguf, tmp_path, engine="llama.cpp", sequences=2, max_model_len=128)
    window = lm.runner.context  # llama.cpp rounds the window up to a multiple of 256
    texts = [TEXT, "Seven apples were on the table near the window of the small kitchen at the end"]
    prompts = [prompt(lm, text) for text in texts]
    cache = new_cache(lm)
    for p in prompts:
        Trace(lm, cache, [row(p, window // 2 - len(p))])  # each stores prompt and answer
    # held in cells, a full-window row would not fit
    assert cache.counters.tokens_stored > window // 2
    assert lm.runner.sequences.in_use() == 0
    two = [row(prompts[0], 6), row(prompts[1], 6)]
    hit = Trace(lm, cache, two)
    assert hit.cached[0] > 0 and hit.texts == Trace(plain, None, two).texts
    long = [row(prompts[0], window - len(prompts[0]))]
    assert Trace(lm, cache, long).texts == Trace(plain, None, long).texts
