"""Operators through plans and real forward passes on the tiny Llama: clamp holds the re-encoded
activation at every prompt and generated position, ablate reads 0, cap limits the projection,
add is the additions-only path bit for bit, mixed rows in one batch equal their solo runs; and
specs resolve their conditions and vectors through real (tiny) probe and vector resolvers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from millm.engine.jobs import ProbeVerdict, Watch
from millm.engine.residual import ResidualEdit
from millm.errors import InvalidRequest
from millm.formats.profiles import validate_spec
from millm.interp.intensity import parse_dial
from millm.interp.steering import steering_edit
from millm.kernel.steering.resolution import Resolvers
from millm.store.profiles import profile_rows
from millm.store.steering import live_features
from tests.integration.engine_helpers import generate, prompt_ids, row
from tests.integration.steering_world import captured, make_world, reading, spec_of

BUDGET = 12
PROMPT = "The old ship sailed into the"


@pytest.fixture
def world(llama_lm, tmp_path):
    made = make_world(llama_lm, tmp_path)
    yield made
    made.store.close()


def run(llama_lm, edit, prompt=PROMPT, budget=BUDGET, point=1):
    ids = prompt_ids(llama_lm, prompt)
    outcome = generate(llama_lm, [reading(row(ids, budget, edit=edit), point)])
    return outcome, len(ids)


def test_clamps_hold_the_re_encoded_activation_at_every_prompt_and_generated_position(
    llama_lm, world
):
    sae = world.sae(1)
    plan = world.planner.plan_for_spec(
        spec_of(
            world,
            [{"index": 5, "op": "clamp", "value": 2.0}, {"index": 9, "op": "clamp", "value": 0.5}],
        ),
        None,
    )
    assert plan.kind == "request" and plan.edit.additions == () and len(plan.edit.operations) == 1
    outcome, prompt_length = run(llama_lm, plan.edit)
    after = captured(outcome, "after")
    # the prompt, then every generated token fed back
    assert after.shape[0] == prompt_length + BUDGET - 1
    read = sae.encode(after)
    assert (
        float((read[:, 5] - 2.0).abs().max()) < 1e-4
        and float((read[:, 9] - 0.5).abs().max()) < 1e-4
    )
    assert outcome.texts[0] != run(llama_lm, None)[0].texts[0]


def test_ablate_reads_zero_and_leaves_positions_where_the_feature_is_silent(llama_lm, world):
    sae = world.sae(1)
    plain, _ = run(llama_lm, None)
    fires = sae.encode(captured(plain, "after")) > 0
    # fires at some positions, not all
    index = int(((fires.sum(0) > 2) & (fires.sum(0) < fires.shape[0] - 2)).float().argmax())
    plan = world.planner.plan_for_spec(spec_of(world, [{"index": index, "op": "ablate"}]), None)
    outcome, _ = run(llama_lm, plan.edit)
    before, after = captured(outcome, "before"), captured(outcome, "after")
    assert torch.equal(sae.encode(after)[:, index], torch.zeros(after.shape[0]))
    silent = sae.encode(before)[:, index] == 0
    assert bool(silent.any()) and bool((~silent).any())
    assert torch.equal(after[silent], before[silent])  # nothing to ablate there: not touched


def test_cap_limits_the_projection_on_the_unit_decoder_row(llama_lm, world):
    sae = world.sae(1)
    unit = sae.W_dec[3] / sae.W_dec[3].norm()
    plain, _ = run(llama_lm, None)
    projections = captured(plain, "after") @ unit
    # above it at about half the positions (never at a position exactly)
    value = float(projections.median()) + 1e-3
    outcome, _ = run(
        llama_lm,
        world.planner.plan_for_spec(
            spec_of(world, [{"index": 3, "op": "cap", "value": value}]), None
        ).edit,
    )
    before, after = captured(outcome, "before"), captured(outcome, "after")
    assert float((after @ unit).max()) <= value + 1e-5
    under = before @ unit <= value
    assert torch.equal(after[under], before[under]) and bool((~under).any())
    assert torch.allclose(after @ unit, torch.clamp(before @ unit, max=value), atol=1e-5)


def test_add_is_the_additions_only_path_bit_for_bit(llama_lm, world):
    strengths = {3: 12.0, 40: -7.5}
    plan = world.planner.plan_for_spec(
        spec_of(world, [{"index": i, "strength": s} for i, s in strengths.items()]), None
    )
    # main's path
    before_operators = steering_edit({world.ids[1]: strengths}, world.steering.attached)
    assert plan.edit.operations == ()
    assert [p for p, _ in plan.edit.additions] == [p for p, _ in before_operators.additions]
    assert all(
        torch.equal(a, b)
        for (_, a), (_, b) in zip(plan.edit.additions, before_operators.additions, strict=True)
    )
    ours, _ = run(llama_lm, plan.edit)
    theirs, _ = run(llama_lm, before_operators)
    assert ours.texts == theirs.texts and torch.equal(
        captured(ours, "after"), captured(theirs, "after")
    )


def test_rows_with_add_clamp_and_none_in_one_batch_equal_their_solo_runs(llama_lm, world):
    add = world.planner.plan_for_spec(spec_of(world, [{"index": 3, "strength": 20.0}]), None).edit
    clamp = world.planner.plan_for_spec(
        spec_of(world, [{"index": 5, "op": "clamp", "value": 3.0}, {"index": 7, "op": "ablate"}]),
        None,
    ).edit
    prompts = [
        prompt_ids(llama_lm, text)
        for text in (PROMPT, "A river", "Every feature reads the old town map")
    ]
    rows = [
        reading(row(prompts[0], BUDGET, edit=add)),
        reading(row(prompts[1], BUDGET, edit=clamp)),
        reading(row(prompts[2], BUDGET)),
        reading(row(prompts[2], BUDGET, edit=clamp)),
    ]
    together = generate(llama_lm, rows)
    for index, spec in enumerate(rows):
        alone = generate(llama_lm, [spec])
        assert together.texts[index] == alone.texts[0]
        assert torch.allclose(
            captured(together, "after", index), captured(alone, "after"), atol=1e-4
        )
    sae = world.sae(1)
    # held in the batch too
    assert float((sae.encode(captured(together, "after", 1))[:, 5] - 3.0).abs().max()) < 1e-4


def test_the_dial_scales_adds_but_not_levels(llama_lm, world):
    spec = spec_of(
        world, [{"index": 3, "strength": 40.0}, {"index": 5, "op": "clamp", "value": 2.0}]
    )
    sae = world.sae(1)
    half = world.planner.plan_for_spec(spec, parse_dial(0.5))
    assert half.intensity == 0.5 and torch.equal(half.edit.vector(1), 20.0 * sae.W_dec[3])
    outcome, _ = run(llama_lm, half.edit)
    # the level is the level
    assert float((sae.encode(captured(outcome, "after"))[:, 5] - 2.0).abs().max()) < 1e-4
    off = world.planner.plan_for_spec(spec, parse_dial("off"))
    assert off.edit is None and off.watches == () and off.kind == "none"


def test_topk_clamps_hold_the_pre_activation(llama_lm, world):
    sae = world.sae(2)
    plan = world.planner.plan_for_spec(
        spec_of(world, [{"index": 8, "op": "clamp", "value": 50.0}], layer=2), None
    )
    outcome, _ = run(llama_lm, plan.edit, point=2)
    after = captured(outcome, "after")
    assert float((sae.pre_activation(after)[:, 8] - 50.0).abs().max()) < 1e-3
    # far above the others: kept by the top-k
    assert float((sae.encode(after)[:, 8] - 50.0).abs().max()) < 1e-3


def test_an_op_its_sae_cannot_honour_is_refused_naming_the_profile(world):
    world.steering.profiles.create(
        {
            "name": "too-wide",
            "steering": [{"sae_id": world.ids[1], "features": [{"index": 200, "op": "ablate"}]}],
        }
    )
    with pytest.raises(InvalidRequest) as refused:
        world.planner.plan_for("too-wide", None)
    assert refused.value.code == "invalid_feature_index" and refused.value.message.startswith(
        "profile 'too-wide': steering[0]: feature 200 is past"
    )
    spec = spec_of(world, [{"index": 2, "op": "clamp", "value": 1.0}])
    world.steering.attached[
        world.ids[1]
    ].sae.normalize_activations = "layer_norm"  # as a file with that normalisation reads
    try:
        with pytest.raises(InvalidRequest) as refused:
            world.planner.plan_for_spec(spec, None)
        assert (
            "layer_norm" in refused.value.message
            and refused.value.code == "operator_not_applicable"
            and refused.value.param == "steering"
        )
    finally:
        world.steering.attached[world.ids[1]].sae.normalize_activations = "none"


def test_a_stored_version_1_profile_steers_exactly_as_before(llama_lm, tmp_path):
    v1 = {
        "kind": "millm.profile",
        "version": 1,
        "name": "old",
        "description": "",
        "steering": [
            {
                "sae_id": "?",
                "features": [{"index": 2, "strength": 8.0}, {"index": 5, "strength": -1.5}],
            }
        ],
    }
    made = make_world(llama_lm, tmp_path, v1_profile=v1)
    try:
        stored = profile_rows(made.store)[0]["document"]
        assert stored["version"] == 2 and [f["op"] for f in stored["steering"][0]["features"]] == [
            "add",
            "add",
        ]
        plan = made.planner.plan_for("old", None)
        expected = steering_edit({made.ids[1]: {2: 8.0, 5: -1.5}}, made.steering.attached)
        assert plan.edit.operations == () and torch.equal(plan.edit.vector(1), expected.vector(1))
    finally:
        made.store.close()


def test_live_values_take_ops_and_refuse_what_the_attached_sae_cannot_hold(llama_lm, world):
    from millm.interp.steering import FeatureOp

    steering, sae = world.steering, world.sae(1)
    steering.set_features(
        {(world.ids[1], 5): FeatureOp("clamp", value=1.5), (world.ids[1], 3): 10.0}
    )
    plan = world.planner.plan_for(None, None)
    assert (
        plan.kind == "live"
        and torch.equal(plan.edit.vector(1), 10.0 * sae.W_dec[3])
        and len(plan.edit.operations) == 1
    )
    outcome, _ = run(llama_lm, plan.edit)
    assert float((sae.encode(captured(outcome, "after"))[:, 5] - 1.5).abs().max()) < 1e-4
    assert live_features(steering.store)[world.ids[1]][5] == {
        "op": "clamp",
        "strength": 0.0,
        "value": 1.5,
    }
    orthogonal = int(
        torch.nn.functional.cosine_similarity(sae.W_enc.T, sae.W_dec, dim=1).abs().argmin()
    )
    sae.W_dec[orthogonal] = 0.0  # a dead feature
    version = steering.version
    with pytest.raises(InvalidRequest) as refused:
        steering.set_features({(world.ids[1], orthogonal): FeatureOp("ablate")})
    assert (
        f"feature {orthogonal} of {world.ids[1]}" in refused.value.message
        and refused.value.param == "op"
        and steering.version == version
        and orthogonal not in steering.features[world.ids[1]]
    )


# ---- conditions and vectors, through real tiny resolvers --------------------------------------
class TinyProbes:
    """A probe book of directions at one point: score = residual · direction, firing at
    `threshold`."""

    def __init__(self, probes: dict[str, tuple[int, torch.Tensor, float]]):
        self.probes, self.revision = probes, 1

    def watch(self, name, attached, action, edit, tokens, detector=None):
        if name not in self.probes:
            return None
        point, direction, threshold = self.probes[name]
        return Watch(name, point, lambda h: h @ direction, threshold, action, edit, tokens)


class TinyVectors:
    """A vector book of unit vectors at one point, for one model."""

    def __init__(self, vectors: dict[str, tuple[int, torch.Tensor]], model_name: str):
        self.vectors, self.model_name, self.revision = vectors, model_name, 1

    def vector(self, vector_id, lm):
        if vector_id not in self.vectors:
            return None
        if lm is None or lm.name != self.model_name:
            raise InvalidRequest(
                f"vector {vector_id} was trained on {self.model_name}", param="vector_id"
            )
        return self.vectors[vector_id]


def direction(seed: int) -> torch.Tensor:
    u = torch.randn(64, generator=torch.Generator().manual_seed(seed))
    return u / u.norm()


@pytest.fixture
def resolved(world, llama_lm):
    probes = TinyProbes(
        {"always": (1, direction(1), float("-inf")), "never": (1, direction(1), float("inf"))}
    )
    vectors = TinyVectors({"vec_a": (2, direction(2))}, llama_lm.name)
    world.steering.resolvers = Resolvers(probes, vectors, lambda: llama_lm)
    return world, probes, vectors


def verdicts(outcome) -> list[ProbeVerdict]:
    return [e for e in outcome.events if isinstance(e, ProbeVerdict)]


def test_a_spec_resolves_conditions_vectors_and_aborts_into_watches(llama_lm, resolved):
    world, _, _ = resolved
    sae = world.sae(1)
    spec = validate_spec(
        {
            "steering": [
                {"sae_id": world.ids[1], "features": [{"index": 3, "strength": 6.0}]},
                {
                    "sae_id": world.ids[1],
                    "features": [
                        {"index": 4, "strength": 30.0},
                        {"index": 5, "op": "cap", "value": 0.1},
                    ],
                    "when": {"probe": "always", "tokens": 3},
                },
            ],
            "vectors": [
                {"vector_id": "vec_a", "strength": 8.0},
                {
                    "vector_id": "vec_a",
                    "op": "cap",
                    "value": 0.2,
                    "when": {"probe": "always", "tokens": 3},
                },
            ],
            "abort": [{"probe": "never"}],
        }
    )
    plan = world.planner.plan_for_spec(spec, parse_dial(0.5))
    assert torch.equal(plan.edit.vector(1), 3.0 * sae.W_dec[3]) and torch.allclose(
        plan.edit.vector(2), 4.0 * direction(2)
    )
    steer, abort = plan.watches
    assert (steer.name, steer.action, steer.tokens, abort.name, abort.action) == (
        "always",
        "steer",
        3,
        "never",
        "abort",
    )
    # the feature cap, the vector cap
    assert (
        torch.equal(steer.edit.vector(1), 15.0 * sae.W_dec[4]) and len(steer.edit.operations) == 2
    )
    ids = prompt_ids(llama_lm, PROMPT)
    outcome = generate(llama_lm, [replace(row(ids, BUDGET, edit=plan.edit), watches=plan.watches)])
    fired = {v.name: v for v in verdicts(outcome)}
    # fired in the prompt: steers from the first generated token
    assert fired["always"].fired and fired["always"].acted_at == len(ids)
    assert not fired["never"].fired and outcome.finish == {0: "length"}
    unconditioned = generate(llama_lm, [row(ids, BUDGET, edit=plan.edit)])
    assert outcome.texts[0] != unconditioned.texts[0]  # the condition's edit changed what followed


def test_an_abort_that_fires_in_the_prompt_ends_the_row_before_any_token(llama_lm, resolved):
    world, _, _ = resolved
    plan = world.planner.plan_for_spec(validate_spec({"abort": [{"probe": "always"}]}), None)
    outcome = generate(
        llama_lm,
        [replace(row(prompt_ids(llama_lm, PROMPT), BUDGET, edit=plan.edit), watches=plan.watches)],
    )
    assert (
        plan.edit is None and outcome.finish == {0: "content_filter"} and outcome.tokens == {0: 0}
    )


def test_a_condition_that_never_fires_leaves_the_row_bit_identical(llama_lm, resolved):
    world, _, _ = resolved
    spec = validate_spec(
        {
            "steering": [
                {
                    "sae_id": world.ids[1],
                    "features": [{"index": 4, "strength": 30.0}],
                    "when": {"probe": "never"},
                }
            ]
        }
    )
    plan = world.planner.plan_for_spec(spec, None)
    assert plan.edit is None and [w.action for w in plan.watches] == ["steer"]
    ids = prompt_ids(llama_lm, PROMPT)
    watched = generate(llama_lm, [reading(replace(row(ids, BUDGET), watches=plan.watches))])
    plain = generate(llama_lm, [reading(row(ids, BUDGET))])
    assert watched.texts == plain.texts and torch.equal(
        captured(watched, "after"), captured(plain, "after")
    )


def test_unknown_probes_and_vectors_are_refused_naming_the_entry(resolved, llama_lm):
    world, _, vectors = resolved
    cases = [
        (
            {"steering": [{"sae_id": world.ids[1], "features": [], "when": {"probe": "nobody"}}]},
            "probe_not_found",
            "steering[0].when: no probe is named 'nobody'",
        ),
        (
            {"abort": [{"probe": "always"}, {"probe": "nobody"}]},
            "probe_not_found",
            "abort[1]: no probe is named 'nobody'",
        ),
        (
            {"vectors": [{"vector_id": "vec_zz", "strength": 1.0}]},
            "vector_not_found",
            "vectors[0]: no steering vector has the id 'vec_zz'",
        ),
    ]
    for raw, code, message in cases:
        with pytest.raises(InvalidRequest) as refused:
            world.planner.plan_for_spec(validate_spec(raw), None)
        assert (
            refused.value.code == code
            and refused.value.param == "steering"
            and message in refused.value.message
        )
    vectors.model_name = "another-model"  # a resolver's own refusal comes through, naming the entry
    vectors.revision += 1
    with pytest.raises(InvalidRequest) as refused:
        world.planner.plan_for_spec(
            validate_spec({"vectors": [{"vector_id": "vec_a", "strength": 1.0}]}), None
        )
    assert (
        refused.value.message == "steering: vectors[0]: vector vec_a was trained on another-model"
    )


def test_without_resolvers_every_probe_and_vector_is_unknown(world):
    for raw, code in (
        ({"abort": [{"probe": "p"}]}, "probe_not_found"),
        ({"vectors": [{"vector_id": "v", "op": "cap", "value": 1.0}]}, "vector_not_found"),
    ):
        with pytest.raises(InvalidRequest) as refused:
            world.planner.plan_for_spec(validate_spec(raw), None)
        assert refused.value.code == code
    # stored: documents are checked structurally
    world.steering.profiles.create({"name": "conditional", "abort": [{"probe": "p"}]})
    with pytest.raises(InvalidRequest) as refused:
        world.planner.plan_for("conditional", None)
    assert (
        refused.value.message == "profile 'conditional': abort[0]: no probe is named 'p'"
        and refused.value.param == "profile"
    )


def test_plans_are_kept_until_the_probes_or_vectors_change(resolved):
    world, probes, vectors = resolved
    spec = validate_spec(
        {"vectors": [{"vector_id": "vec_a", "strength": 2.0}], "abort": [{"probe": "never"}]}
    )
    first = world.planner.plan_for_spec(spec, None)
    # an equal spec: the same plan
    assert world.planner.plan_for_spec(json.loads(json.dumps(spec)), None) is first
    probes.revision += 1
    second = world.planner.plan_for_spec(spec, None)
    assert second is not first
    vectors.vectors["vec_a"] = (2, direction(5))
    vectors.revision += 1
    assert torch.allclose(
        world.planner.plan_for_spec(spec, None).edit.vector(2), 2.0 * direction(5)
    )
    del vectors.vectors["vec_a"]
    vectors.revision += 1
    with pytest.raises(InvalidRequest) as refused:
        world.planner.plan_for_spec(spec, None)
    assert refused.value.code == "vector_not_found"


def test_a_profile_with_conditions_puts_its_watches_in_the_plan(resolved):
    world, _, _ = resolved
    row_ = world.steering.profiles.create(
        {
            "name": "dinner",
            "steering": [
                {
                    "sae_id": world.ids[1],
                    "features": [{"index": 4, "strength": 9.0}],
                    "when": {"probe": "always"},
                }
            ],
            "abort": [{"probe": "never"}],
        }
    )
    plan = world.planner.plan_for("dinner", None)
    assert (
        plan.kind == "profile"
        and plan.edit is None
        and [w.action for w in plan.watches] == ["steer", "abort"]
    )
    world.steering.activate_profile(row_["id"])
    active = world.planner.plan_for(None, None)
    assert [w.name for w in active.watches] == ["always", "never"]
    assert isinstance(active.watches[0].edit, ResidualEdit)
