"""Reads and writes inside llama.cpp's graph, on the tiny Llama's F32 GGUF file, against the lean
transformers runner on the same weights (float32): SAE activations at both read points, every
operator's effect, probe verdicts, MLP inputs, the last block, the embeddings, and rows with
different plans in one decode each equal to their solo run."""

from __future__ import annotations

import gc
from dataclasses import replace

import pytest
import torch

from millm.engine.generate import Lane
from millm.engine.jobs import GenerationJob, ProbeVerdict, ResidualRead, ResidualsRead, Watch
from millm.engine.residual import EMBEDDINGS, ResidualEdit, SourcedOperation, mlp_input
from tests.integration.engine_helpers import Outcome, generate, logits_of, prompt_ids, row
from tests.integration.steering_world import World, make_world, spec_of

PROMPT = "The old ship sailed into the"
BUDGET = 10
TOLERANCE = 1e-4


@pytest.fixture
def world(llama_lm, tmp_path):
    made = make_world(llama_lm, tmp_path)
    yield made
    made.store.close()


def plan(world: World, features: list[dict], layer: int = 1) -> ResidualEdit:
    return world.planner.plan_for_spec(spec_of(world, features, layer), None).edit


def reads_of(outcome, index: int = 0) -> dict[str, ResidualsRead]:
    return {e.tag: e for e in outcome.events if isinstance(e, ResidualsRead) and e.row == index}


def both(lm_pair, rows):
    return [generate(lm, rows) for lm in lm_pair]


def encoded_reads(world: World, layer: int) -> tuple[ResidualRead, ...]:
    encode = world.sae(layer).encode
    return (
        ResidualRead(layer, False, "all", "before", encode=encode),
        ResidualRead(layer, True, "all", "after", encode=encode),
    )


@pytest.mark.parametrize("layer", [1, 2])  # block 2 is the tiny model's last
def test_sae_activations_at_both_read_points_equal_the_transformers_engine(
    cpp_lm, llama_lm, world, layer
):
    prompt = prompt_ids(cpp_lm, PROMPT)
    edit = plan(world, [{"index": 7, "strength": 8.0}], layer)
    spec = replace(row(prompt, BUDGET, edit=edit), reads=encoded_reads(world, layer))
    ours, theirs = both((cpp_lm, llama_lm), [spec])
    assert ours.texts == theirs.texts and not ours.failed
    for side in ("before", "after"):
        mine, other = reads_of(ours)[side], reads_of(theirs)[side]
        assert mine.positions == other.positions == tuple(range(len(prompt) + BUDGET - 1))
        # float32 sums in another order: within 1e-5 of the residual's largest value
        gap = (mine.residuals - other.residuals).abs().max() / other.residuals.abs().max()
        assert gap.item() < 1e-5
        assert (mine.encoded - other.encoded).abs().max().item() < TOLERANCE
    moved = reads_of(ours)["after"].encoded[:, 7] - reads_of(ours)["before"].encoded[:, 7]
    assert moved.mean().item() > 1.0  # the addition shows in the read after it


@pytest.mark.parametrize(
    "feature",
    [
        {"index": 5, "op": "clamp", "value": 2.0},
        {"index": 9, "op": "ablate"},
        {"index": 3, "op": "cap", "value": 0.1},
        {"index": 11, "strength": -6.0},
    ],
    ids=["clamp", "ablate", "cap", "add"],
)
def test_each_operators_effect_equals_the_transformers_engine(cpp_lm, llama_lm, world, feature):
    prompt = prompt_ids(cpp_lm, PROMPT)
    edit = plan(world, [feature])
    spec = replace(row(prompt, BUDGET, edit=edit), reads=encoded_reads(world, 1))
    ours, theirs = both((cpp_lm, llama_lm), [spec])
    assert ours.texts == theirs.texts
    mine, other = reads_of(ours)["after"], reads_of(theirs)["after"]
    assert (mine.residuals - other.residuals).abs().max().item() < TOLERANCE
    index = feature["index"]
    if feature.get("op") == "clamp":
        assert mine.encoded[:, index] == pytest.approx(
            torch.full((len(mine.positions),), 2.0), abs=1e-3
        )
    if feature.get("op") == "ablate":
        assert mine.encoded[:, index].abs().max().item() < 1e-3
    # the steered logits' change from the unsteered ones, on each engine
    deltas = []
    for lm in (cpp_lm, llama_lm):
        steered = logits_of(lm, [prompt], edit)
        deltas.append(steered - logits_of(lm, [prompt], None))
    assert deltas[0].abs().max().item() > 1e-3  # the operator moves the answer
    assert (deltas[0] - deltas[1]).abs().max().item() < TOLERANCE


def test_rows_with_different_plans_share_one_decode_a_step_and_equal_their_solo_runs(cpp_lm, world):
    prompts = [prompt_ids(cpp_lm, text) for text in (PROMPT, "A river runs", "Once upon", "Seven")]
    edits = [
        None,
        plan(world, [{"index": 7, "strength": 8.0}]),
        plan(world, [{"index": 5, "op": "clamp", "value": 3.0}]),
        plan(world, [{"index": 4, "strength": 5.0}, {"index": 6, "op": "cap", "value": 0.0}], 2),
    ]
    rows = [
        replace(row(p, BUDGET, edit=e), reads=encoded_reads(world, 1))
        for p, e in zip(prompts, edits, strict=True)
    ]
    solo = [generate(cpp_lm, [spec]) for spec in rows]
    before = cpp_lm.runner.decodes
    together = generate(cpp_lm, rows)
    # one prefill (four prompts in one micro-batch), then one decode a step for all four plans
    assert cpp_lm.runner.decodes - before == BUDGET
    assert [together.texts[i] for i in range(4)] == [s.texts[0] for s in solo]
    assert len({s.texts[0] for s in solo}) == 4
    for i, alone in enumerate(solo):
        for side in ("before", "after"):
            gap = reads_of(together, i)[side].residuals - reads_of(alone)[side].residuals
            assert gap.abs().max().item() < TOLERANCE


def test_rows_with_their_own_plans_joining_a_running_batch_equal_their_solo_runs(cpp_lm, world):
    prompts = [prompt_ids(cpp_lm, text) for text in (PROMPT, "A river runs", "Once upon")]
    edits = [
        plan(world, [{"index": 7, "strength": 8.0}]),
        plan(world, [{"index": 5, "op": "clamp", "value": 3.0}]),
        None,
    ]
    rows = [
        replace(row(p, BUDGET, edit=e), reads=encoded_reads(world, 1))
        for p, e in zip(prompts, edits, strict=True)
    ]
    solo = [generate(cpp_lm, [spec]) for spec in rows]
    outcomes = [Outcome() for _ in rows]
    jobs = [
        GenerationJob(rows=[spec], emit=o.record) for spec, o in zip(rows, outcomes, strict=True)
    ]
    lane = Lane(cpp_lm)
    with torch.inference_mode():
        lane.join(jobs[0])
        for _ in range(3):
            lane.step()
        lane.join(jobs[1])  # a clamped row joins an added one midway
        for _ in range(3):
            lane.step()
        lane.join(jobs[2])
        while lane.rows:
            lane.step()
    for alone, together in zip(solo, outcomes, strict=True):
        assert together.texts[0] == alone.texts[0]
        for side in ("before", "after"):
            gap = reads_of(together)[side].residuals - reads_of(alone)[side].residuals
            assert gap.abs().max().item() < TOLERANCE


def test_probe_verdicts_and_firing_positions_equal_the_transformers_engine(cpp_lm, llama_lm, world):
    prompt = prompt_ids(cpp_lm, PROMPT)
    direction = world.sae(1).W_dec[7].detach().float()
    threshold = 0.5
    watch = Watch("seven", 1, lambda h: h @ direction, threshold, "report")
    edit = plan(world, [{"index": 7, "strength": 2.0}])
    spec = replace(row(prompt, BUDGET, edit=edit), watches=(watch,))
    verdicts = []
    for lm in (cpp_lm, llama_lm):
        outcome = generate(lm, [spec])
        verdicts.append(next(e for e in outcome.events if isinstance(e, ProbeVerdict)))
    ours, theirs = verdicts
    assert ours.fired and ours.positions == theirs.positions
    assert (ours.first_position, ours.peak_position) == (
        theirs.first_position,
        theirs.peak_position,
    )
    assert ours.peak == pytest.approx(theirs.peak, abs=TOLERANCE)


def test_an_abort_watch_ends_the_row_where_the_transformers_engine_does(cpp_lm, llama_lm, world):
    prompt = prompt_ids(cpp_lm, PROMPT)
    direction = world.sae(1).W_dec[7].detach().float()
    scores = []
    for lm in (cpp_lm, llama_lm):
        watch = Watch("stop", 1, lambda h: h @ direction, 0.0, "abort", skip=len(prompt) + 2)
        outcome = generate(lm, [replace(row(prompt, BUDGET), watches=(watch,))])
        verdict = next(e for e in outcome.events if isinstance(e, ProbeVerdict))
        scores.append((outcome.texts.get(0, ""), outcome.finish[0], verdict.acted_at))
    assert scores[0] == scores[1]


def test_a_when_watch_steers_from_where_the_transformers_engine_does(cpp_lm, llama_lm, world):
    prompt = prompt_ids(cpp_lm, PROMPT)
    direction = world.sae(1).W_dec[7].detach().float()
    then = plan(world, [{"index": 11, "strength": 12.0}])
    outcomes = []
    for lm in (cpp_lm, llama_lm):
        watch = Watch("when", 1, lambda h: h @ direction, 0.0, "steer", edit=then, tokens=3)
        outcome = generate(lm, [replace(row(prompt, BUDGET), watches=(watch,))])
        verdict = next(e for e in outcome.events if isinstance(e, ProbeVerdict))
        outcomes.append((outcome.texts[0], verdict.acted_at, verdict.positions))
    assert outcomes[0] == outcomes[1] and outcomes[0][1] is not None
    assert outcomes[0][0] != generate(cpp_lm, [row(prompt, BUDGET)]).texts[0]  # it steered


def test_mlp_inputs_and_the_embeddings_are_read_and_steered_as_on_the_transformers_engine(
    cpp_lm, llama_lm
):
    prompt = prompt_ids(cpp_lm, PROMPT)
    width = cpp_lm.config.hidden_size
    vector = 3.0 * torch.randn(width, generator=torch.Generator().manual_seed(4))
    edit = ResidualEdit(((EMBEDDINGS, vector),))
    reads = (
        ResidualRead(mlp_input(1), False, "all", "mlp"),
        ResidualRead(EMBEDDINGS, True, "prompt", "embeddings"),
    )
    spec = replace(row(prompt, BUDGET, edit=edit), reads=reads)
    ours, theirs = both((cpp_lm, llama_lm), [spec])
    assert ours.texts == theirs.texts
    for tag in ("mlp", "embeddings"):
        mine, other = reads_of(ours)[tag], reads_of(theirs)[tag]
        assert mine.positions == other.positions
        assert (mine.residuals - other.residuals).abs().max().item() < TOLERANCE
    delta = [
        logits_of(lm, [prompt], edit) - logits_of(lm, [prompt], None) for lm in (cpp_lm, llama_lm)
    ]
    assert delta[0].abs().max().item() > 0.1
    assert (delta[0] - delta[1]).abs().max().item() < TOLERANCE


def test_nothing_installed_hooks_no_node_and_a_failing_operation_fails_its_job_only(cpp_lm):
    prompt = prompt_ids(cpp_lm, PROMPT)
    plain = generate(cpp_lm, [row(prompt, BUDGET)])
    assert cpp_lm.runner.hooks.names == []  # llama.cpp computes the graph whole

    def broken(hidden):
        raise ValueError("this operation breaks")

    with pytest.raises(
        ValueError, match="this operation breaks"
    ):  # the scheduler answers the job with it
        generate(cpp_lm, [row(prompt, BUDGET, edit=ResidualEdit((), ((1, broken),)))])
    assert generate(cpp_lm, [row(prompt, BUDGET)]).texts == plain.texts
    gc.collect()  # the failed job's batch was held by the exception's frames
    assert cpp_lm.runner.sequences.in_use() == 0


def test_without_a_c_compiler_the_same_hooks_run_in_python(
    cpp_lm, tiny_gguf, tmp_path, world, monkeypatch
):
    from tests.conftest import load_tiny

    monkeypatch.setenv("PATH", str(tmp_path / "no-compilers-here"))
    fallback = load_tiny(tiny_gguf, tmp_path / "home", engine="llama.cpp", sequences=4)
    try:
        assert fallback.runner.kernels.endswith("graph hooks Python)")
        prompt = prompt_ids(cpp_lm, PROMPT)
        edits = [
            plan(world, [{"index": 7, "strength": 8.0}]),
            plan(world, [{"index": 5, "op": "clamp", "value": 3.0}]),
        ]
        for edit in edits:
            spec = replace(row(prompt, BUDGET, edit=edit), reads=encoded_reads(world, 1))
            ours, compiled = generate(fallback, [spec]), generate(cpp_lm, [spec])
            assert ours.texts == compiled.texts
            for side in ("before", "after"):
                gap = reads_of(ours)[side].residuals - reads_of(compiled)[side].residuals
                assert gap.abs().max().item() == 0.0  # the same values, copied by other code
    finally:
        fallback.runner.close()


def test_an_operation_reading_the_mlp_input_equals_the_transformers_engine(cpp_lm, llama_lm):
    # what a transcoder's clamp does: read block 1's MLP input, rewrite the residual after block 1
    prompt = prompt_ids(cpp_lm, PROMPT)
    mix = torch.randn(cpp_lm.config.hidden_size, generator=torch.Generator().manual_seed(9))
    sourced = SourcedOperation(
        mlp_input(1), lambda residual, source: residual + mix * source, "mix"
    )
    edit = ResidualEdit(((1, 2.0 * mix),), ((1, sourced),))
    delta = [
        logits_of(lm, [prompt], edit) - logits_of(lm, [prompt], None) for lm in (cpp_lm, llama_lm)
    ]
    assert delta[0].abs().max().item() > 0.1
    assert (delta[0] - delta[1]).abs().max().item() < TOLERANCE
    spec = replace(row(prompt, BUDGET, edit=edit), reads=(ResidualRead(1, True, "all", "after"),))
    ours, theirs = both((cpp_lm, llama_lm), [spec])
    assert ours.texts == theirs.texts
    gap = reads_of(ours)["after"].residuals - reads_of(theirs)["after"].residuals
    assert gap.abs().max().item() / reads_of(theirs)["after"].residuals.abs().max().item() < 1e-5
