"""Plans for clusters and circuits on a tiny model with two SAEs at two layers: exact residual
deltas."""

import logging

import pytest
import torch
from sqlalchemy import event

from millm.errors import NotFound
from millm.formats.mistudio import circuit_members
from millm.interp.binding import circuit_bindings, circuit_mode
from millm.interp.intensity import parse_dial
from millm.interp.steering import InvalidFeatureIndex
from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.steering.base_fit import BaseUnfit, DialLimits
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.steering.saes import SAERegistry
from millm.store.database import Store, database_url
from tests.integration.engine_helpers import prompt_ids
from tests.integration.test_steering_engine import residuals
from tests.support.mistudio_docs import circuit, cluster, raw
from tests.support.tiny_saes import build_saelens


@pytest.fixture
def world(llama_lm, tmp_path):
    store = Store(database_url(tmp_path, None))
    registry = SAERegistry(store, tmp_path / "hub", LabelBook(store))
    steering = Steering(store, registry, ProfileBook(store))
    ids = {}
    for layer in (1, 2):
        info, _ = registry.register(
            str(build_saelens(tmp_path / f"sae{layer}", layer=layer, seed=40 + layer)),
            None,
            None,
            None,
        )
        steering.attach(llama_lm, info.id, None)
        ids[layer] = info.id
    clusters, circuits = ClusterBook(store, 2.0), CircuitBook(store)
    planner = Planner(steering, clusters, circuits, DialLimits())
    yield steering, clusters, circuits, planner, ids
    store.close()


def vector(steering, sae_id, strengths):
    sae = steering.attached[sae_id].sae
    return sum(s * sae.W_dec[i] for i, s in strengths.items())


def test_cluster_plan_is_clamped_sign_strength_lambda(world):
    steering, clusters, _, planner, ids = world
    (row,) = clusters.import_raw(raw(cluster(intensity_range=[0.5, 1.5])), "fail")
    steering.set_active("cluster", row["id"])
    plan = planner.plan_for(None, parse_dial(1.8))  # capped at the declared 1.5
    assert plan.kind == "cluster" and plan.intensity == 1.5
    # 150 * 1.5 = 225 -> clamped to 200
    expected = vector(steering, ids[1], {3: 15.0, 7: -30.0, 9: 200.0})
    assert torch.allclose(plan.edit.vector(1), expected, atol=1e-5)
    plan = planner.plan_for(None, None)  # no dial: the cluster's persistent dial (1.0)
    assert plan.intensity is None
    assert torch.allclose(
        plan.edit.vector(1), vector(steering, ids[1], {3: 10.0, 7: -20.0, 9: 150.0}), atol=1e-5
    )
    clusters.set_intensity(row["id"], 0.5)
    assert torch.allclose(
        planner.plan_for(None, None).edit.vector(1),
        vector(steering, ids[1], {3: 5.0, 7: -10.0, 9: 75.0}),
        atol=1e-5,
    )


def test_circuit_in_full_steers_both_layers_and_reports_its_rung(world, llama_lm):
    steering, _, circuits, planner, ids = world
    row = circuits.import_raw(raw(circuit(intensity_range=[0.5, 1.5])), "fail")
    steering.set_active("circuit", row["id"])
    plan = planner.plan_for(None, parse_dial(0.1))  # the circuit rule clamps up to the floor
    assert plan.intensity == 0.5 and plan.rung == 2 and dict(plan.params)["mode"] == "full"
    at1 = vector(steering, ids[1], {4: 15.0})
    at2 = vector(steering, ids[2], {5: -20.0, 6: 75.0})
    assert torch.allclose(plan.edit.vector(1), at1, atol=1e-5)
    assert torch.allclose(plan.edit.vector(2), at2, atol=1e-5)
    # And in the model: the residual after each hooked block moves by exactly those vectors.
    prompt = prompt_ids(llama_lm, "A river")
    only_1 = type(plan.edit)(tuple(a for a in plan.edit.additions if a[0] == 1))
    plain = residuals(llama_lm, prompt, None, [1])
    steered = residuals(llama_lm, prompt, plan.edit, [1, 2])
    after_1 = residuals(llama_lm, prompt, only_1, [2])
    assert torch.allclose(steered[1] - plain[1], at1.expand_as(plain[1]), atol=1e-5)
    assert torch.allclose(steered[2] - after_1[2], at2.expand_as(steered[2]), atol=1e-5)
    assert planner.plan_for(None, parse_dial("max")).intensity == 1.5
    assert planner.plan_for(None, parse_dial("off")).edit is None


def test_circuit_bindings_and_slice_fallback(world, llama_lm):
    steering, _, circuits, planner, ids = world
    doc = circuit(n_features=(128, 64))  # layer 2 declares another width: block
    bindings = circuit_bindings(doc, steering.attached)
    assert {layer: b.status for layer, b in bindings.items()} == {1: "bind", 2: "block"}
    assert "n_features 64" in bindings[2].detail and "128" in bindings[2].detail
    assert circuit_mode(bindings, circuit_members(doc)) == "slice_fallback"
    row = circuits.import_raw(raw(doc), "fail")
    steering.set_active("circuit", row["id"])
    plan = planner.plan_for(None, parse_dial("min"))
    assert dict(plan.params)["mode"] == "slice_fallback" and plan.rung is None
    assert plan.intensity == 0.5  # the cluster rule's 0.5 floor
    assert plan.edit.points == {1}
    undeclared = circuit(name="undeclared")
    undeclared["saes"] = [{"layer": 1}, {"layer": 2}]
    assert {b.status for b in circuit_bindings(undeclared, steering.attached).values()} == {"warn"}
    steering.detach(ids[1]), steering.detach(ids[2])
    assert {b.status for b in circuit_bindings(doc, steering.attached).values()} == {"unbound"}
    # Nothing binds any more: refused (naming the circuit and each layer), never served unsteered.
    with pytest.raises(BaseUnfit, match="none of its member layers binds") as refused:
        planner.plan_for(None, parse_dial(1.0))
    assert (
        refused.value.code == "invalid_feature_index"
        and "layer 1: no SAE is attached" in refused.value.message
    )
    assert planner.active_fit()["fits"] is False
    assert planner.plan_for(None, parse_dial("off")).edit is None  # off never looks at the base


def test_circuit_without_declared_range_min_equals_off(world):
    steering, _, circuits, planner, _ = world
    row = circuits.import_raw(raw(circuit()), "fail")
    steering.set_active("circuit", row["id"])
    plan = planner.plan_for(None, parse_dial("min"))
    assert plan.edit is None and plan.kind == "none"


def test_profile_and_live_bases_follow_the_cluster_rule_defaults(world):
    steering, _, _, planner, ids = world
    steering.set_features({(ids[1], 2): 100.0})
    assert torch.allclose(
        planner.plan_for(None, parse_dial("min")).edit.vector(1),
        vector(steering, ids[1], {2: 50.0}),
        atol=1e-5,
    )
    assert torch.allclose(
        planner.plan_for(None, parse_dial(1.9)).edit.vector(1),
        vector(steering, ids[1], {2: 190.0}),
        atol=1e-5,
    )
    assert torch.allclose(
        planner.plan_for(None, parse_dial("max")).edit.vector(1),
        vector(steering, ids[1], {2: 200.0}),
        atol=1e-5,
    )
    plan = planner.plan_for(None, parse_dial(0))
    assert plan.edit is None and plan.intensity == 0.0  # the dial changed steering: echoed
    steering.set_enabled(False)
    assert planner.plan_for(None, parse_dial(1.0)).intensity is None  # disabled, dial-only: omitted
    steering.set_enabled(True)
    steering.set_features({}, clear=True)
    assert planner.plan_for(None, parse_dial(1.0)).intensity is None  # empty base: omitted


def test_off_never_validates_the_base(world):
    steering, _, _, planner, ids = world
    # A valid document, but feature 999 is past the attached SAE's width (128).
    steering.profiles.create(
        {
            "name": "too-wide",
            "steering": [{"sae_id": ids[1], "features": [{"index": 999, "strength": 1}]}],
        }
    )
    with pytest.raises(InvalidFeatureIndex):
        planner.plan_for("too-wide", parse_dial(0.01))
    plan = planner.plan_for("too-wide", parse_dial("off"))
    assert plan.edit is None and plan.intensity == 0.0
    # unknown profile: no echo, no 404
    assert planner.plan_for("ghost", parse_dial(0)).intensity is None


def test_an_active_profile_that_stops_fitting_is_refused_not_trimmed(world, llama_lm):
    steering, _, _, planner, ids = world
    row = steering.profiles.create(
        {
            "name": "both-layers",
            "steering": [
                {"sae_id": ids[1], "layer": 1, "features": [{"index": 3, "strength": 10}]},
                {"sae_id": ids[2], "layer": 2, "features": [{"index": 4, "strength": 20}]},
            ],
        }
    )
    steering.activate_profile(row["id"])
    full = planner.plan_for(None, None)
    assert full.edit.points == {1, 2}
    assert planner.active_fit() == {
        "kind": "profile",
        "id": row["id"],
        "name": "both-layers",
        "fits": True,
        "problem": None,
    }
    steering.detach(ids[2])
    # Before: served with layer 1 only, as if it were the whole profile. Now: a 400 naming both.
    with pytest.raises(BaseUnfit) as refused:
        planner.plan_for(None, None)
    assert "'both-layers'" in refused.value.message and ids[2] in refused.value.message
    assert refused.value.status == 400 and refused.value.code == "invalid_feature_index"
    fit = planner.active_fit()
    assert fit["fits"] is False and ids[2] in fit["problem"]
    steering.set_enabled(False)
    # steering off: nothing is claimed, nothing refused
    assert planner.plan_for(None, None).kind == "none"
    steering.set_enabled(True)
    steering.attach(llama_lm, ids[2], None)
    again = planner.plan_for(None, None)
    assert again.edit.points == {1, 2}
    assert torch.allclose(again.edit.vector(2), vector(steering, ids[2], {4: 20.0}), atol=1e-5)


def test_an_active_cluster_whose_sae_went_away_is_refused(world):
    steering, clusters, _, planner, ids = world
    row = clusters.import_raw(raw(cluster(name="layer-two", layer=2)), "fail")[0]
    steering.set_active("cluster", row["id"])
    assert planner.plan_for(None, None).kind == "cluster"
    steering.detach(ids[2])
    with pytest.raises(BaseUnfit, match="'layer-two' no longer fits") as refused:
        planner.plan_for(None, None)
    assert "no SAE is attached at layer 2" in refused.value.problem


def test_a_circuit_member_past_the_width_is_refused_not_skipped(world):
    steering, _, circuits, planner, ids = world
    doc = circuit(name="too-wide")
    doc["members"][0]["feature"]["feature_idx"] = 500  # the SAEs have 128 features
    doc["saes"] = [{"layer": 1}, {"layer": 2}]  # undeclared widths: they bind unchecked (warn)
    row = circuits.import_raw(raw(doc), "fail")
    steering.set_active("circuit", row["id"])
    with pytest.raises(BaseUnfit, match="feature 500") as refused:
        planner.plan_for(None, None)
    assert "128 features" in refused.value.message


def test_members_on_one_feature_are_summed_then_clamped_to_the_steering_range(world):
    steering, clusters, _, planner, ids = world
    members = [
        {"feature_idx": 9, "strength": 150.0},
        {"feature_idx": 9, "strength": 150.0},  # 300 in sum -> 200
        {"feature_idx": 3, "strength": 150.0},
        {"feature_idx": 3, "strength": 150.0},
        {
            "feature_idx": 3,
            "strength": 150.0,
            "sign": -1,
        },  # 150 in sum, whatever the order (not 200 - 150)
    ]
    (row,) = clusters.import_raw(raw(cluster(members=members)), "fail")
    steering.set_active("cluster", row["id"])
    plan = planner.plan_for(None, parse_dial(1.0))
    assert torch.allclose(
        plan.edit.vector(1), vector(steering, ids[1], {9: 200.0, 3: 150.0}), atol=1e-5
    )


def statements(store):
    """A list that every SQL statement the store sends from now on is appended to."""
    sent = []
    event.listen(
        store.engine, "before_cursor_execute", lambda conn, cursor, sql, *rest: sent.append(sql)
    )
    return sent


def test_plans_are_kept_while_nothing_changes_and_made_afresh_after_any_change(world):
    steering, _, _, planner, ids = world
    steering.set_features({(ids[1], 2): 10.0})
    first = planner.plan_for(None, None)
    assert planner.plan_for(None, None) is first
    assert planner.plan_for(None, parse_dial(0.5)) is planner.plan_for(None, parse_dial(0.5))
    steering.set_features({(ids[1], 2): 30.0})
    assert torch.allclose(
        planner.plan_for(None, None).edit.vector(1), vector(steering, ids[1], {2: 30.0}), atol=1e-5
    )
    # A per-request profile edited or deleted through its book moves no steering version: still seen
    # at once.
    steering.profiles.create(
        {
            "name": "mine",
            "steering": [{"sae_id": ids[2], "features": [{"index": 4, "strength": 5}]}],
        }
    )
    assert torch.allclose(
        planner.plan_for("mine", None).edit.vector(2), vector(steering, ids[2], {4: 5.0}), atol=1e-5
    )
    steering.profiles.update(
        "mine", {"steering": [{"sae_id": ids[2], "features": [{"index": 4, "strength": -8}]}]}
    )
    assert torch.allclose(
        planner.plan_for("mine", None).edit.vector(2),
        vector(steering, ids[2], {4: -8.0}),
        atol=1e-5,
    )
    steering.profiles.delete("mine")
    for _ in range(2):
        with pytest.raises(NotFound):
            planner.plan_for("mine", None)


def test_a_restore_after_a_reload_is_planned_afresh(world, llama_lm):
    steering, _, _, planner, ids = world
    steering.set_features({(ids[1], 2): 10.0})
    assert planner.plan_for(None, None).kind == "live"
    steering.detach_all()  # the model went away
    assert planner.plan_for(None, None).kind == "none"
    version = steering.version
    steering.restore(llama_lm)  # reloaded: the same attachments again, the version unchanged
    assert steering.version == version
    plan = planner.plan_for(None, None)
    assert plan.kind == "live" and torch.allclose(
        plan.edit.vector(1), vector(steering, ids[1], {2: 10.0}), atol=1e-5
    )


def test_planning_reads_no_database(world):
    steering, clusters, circuits, planner, ids = world
    (cluster_row,) = clusters.import_raw(raw(cluster()), "fail")
    circuit_row = circuits.import_raw(raw(circuit()), "fail")
    profile = steering.profiles.create(
        {"name": "own", "steering": [{"sae_id": ids[1], "features": [{"index": 1, "strength": 3}]}]}
    )
    steering.set_features({(ids[1], 2): 10.0})
    sent = statements(steering.store)
    plans = [planner.plan_for(None, None), planner.plan_for("own", parse_dial(0.5))]
    for kind, base in (("cluster", cluster_row), ("circuit", circuit_row), ("profile", profile)):
        steering.set_active(kind, base["id"])
        before = len(sent)
        plans += [
            planner.plan_for(None, None),
            planner.plan_for(None, parse_dial("max")),
            planner.plan_for("own", None),
        ]
        assert len(sent) == before  # each of them made afresh (a new version), none read the store
    assert [p.kind for p in plans] == ["live", "profile"] + ["cluster"] * 2 + ["profile"] + [
        "circuit"
    ] * 2 + ["profile"] + ["profile"] * 3
    # only set_active's writes and its read-back of the steering tables
    steering_reads = ("FROM MILLM_STRENGTHS", "FROM MILLM_SETTINGS", "FROM MILLM_ATTACHMENTS")
    assert all(
        sql.lstrip().upper().startswith(("INSERT", "DELETE", "UPDATE"))
        or any(t in sql.upper() for t in steering_reads)
        for sql in sent
    )


def test_an_unfit_base_is_refused_every_time_and_logged_once_per_state(world, caplog):
    steering, clusters, _, planner, ids = world
    (row,) = clusters.import_raw(raw(cluster(name="layer-two", layer=2)), "fail")
    steering.set_active("cluster", row["id"])
    steering.detach(ids[2])
    caplog.set_level(logging.WARNING, logger="millm.kernel.steering.plans")
    for _ in range(3):
        with pytest.raises(BaseUnfit):
            planner.plan_for(None, None)
    unfit = [r for r in caplog.records if "refusing steered requests" in r.getMessage()]
    assert len(unfit) == 1 and "'layer-two'" in unfit[0].getMessage()
    steering.set_enabled(True)  # a new state (version): logged again, once
    for _ in range(2):
        with pytest.raises(BaseUnfit):
            planner.plan_for(None, parse_dial(1.0))
    assert len([r for r in caplog.records if "refusing steered requests" in r.getMessage()]) == 2


def test_live_values_of_a_detached_sae_are_logged_once(world, caplog):
    steering, _, _, planner, ids = world
    steering.set_features({(ids[1], 2): 10.0, (ids[2], 3): 5.0})
    steering.detach(ids[2])
    caplog.set_level(logging.WARNING, logger="millm.kernel.steering.plans")
    plans = [
        planner.plan_for(None, None),
        planner.plan_for(None, parse_dial(0.5)),
        planner.plan_for(None, None),
    ]
    assert [p.edit.points for p in plans] == [{1}, {1}, {1}]
    logged = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert logged == [f"live steering values of {ids[2]} are not applied: not attached"]
