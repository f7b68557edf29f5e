"""miStudio document validation (every problem listed), rungs, members."""

import pytest

from millm.formats.mistudio import (
    InvalidDocument,
    authored_intensity,
    check_circuit,
    circuit_members,
    cluster_definitions,
    cluster_members,
    declared_range,
    rung,
)
from tests.support.mistudio_docs import circuit, cluster


def test_valid_cluster_and_members():
    (doc,) = cluster_definitions(cluster())
    # the raw document, unknown keys included (it is exported byte for byte)
    assert doc == cluster()
    members = cluster_members(doc)
    assert [(m.feature_idx, m.strength, m.sign, m.layer) for m in members] == [
        (3, 10.0, 1, 1),
        (7, 20.0, -1, 1),
        (9, 150.0, 1, 1),
    ]
    assert declared_range(doc) is None and authored_intensity(doc) == 1.0
    assert declared_range(cluster(intensity_range=[0.5, 1.5])) == (0.5, 1.5)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"kind": "other"}, "kind: Input should be 'mistudio.cluster-definition'"),
        ({"schema_version": 1}, "schema_version: Input should be '1', got 1"),
        ({"name": ""}, "name: String should have at least 1 character"),
        ({"name": "x" * 121}, "name: String should have at most 120 characters"),
        ({"narrative": "x" * 10001}, "narrative: String should have at most 10000 characters"),
        ({"members": []}, "members: List should have at least 1 item"),
        (
            {"members": [{"feature_idx": 1, "strength": 1}] * 21},
            "members: List should have at most 20 items",
        ),
        ({"members": [{"strength": 1}]}, "members[0].feature_idx: required"),
        (
            {"members": [{"feature_idx": 1, "strength": 301}]},
            "members[0].strength: Input should be less than or equal to 300, got 301",
        ),
        (
            {"members": [{"feature_idx": 1, "strength": 1, "sign": 2}]},
            "members[0].sign: Input should be 1 or -1, got 2",
        ),
        (
            {"members": [{"feature_idx": 1, "strength": 1, "sign": True}]},
            "members[0].sign: Input should be 1 or -1, got true",
        ),
        (
            {
                "members": [
                    {"feature_idx": 1, "strength": 1, "meta": {"top_tokens": list(range(11))}}
                ]
            },
            "members[0].meta.top_tokens",
        ),
        (
            {"members": [{"feature_idx": 1, "strength": 1, "similarity": 1.5}]},
            "members[0].similarity",
        ),
        ({"sae": {"source_hint": "/home/me/sae"}}, "sae.source_hint: must look like hf:"),
        (
            {"budget": {"intensity": 2.5}},
            "budget.intensity: Input should be less than or equal to 2, got 2.5",
        ),
        (
            {"budget": {"intensity_range": [1.5, 0.5]}},
            "budget.intensity_range: [lo, hi] with lo <= hi",
        ),
        (
            {"provenance": {"source_note": "x" * 501}},
            "provenance.source_note: String should have at most 500 characters",
        ),
    ],
)
def test_cluster_problems(change, problem):
    with pytest.raises(InvalidDocument) as info:
        cluster_definitions({**cluster(), **change})
    assert problem in info.value.message and info.value.status == 400


def test_bundles_are_refused_whole_naming_the_definition():
    bundle = {
        "kind": "mistudio.cluster-bundle",
        "schema_version": "1",
        "definitions": [cluster(), {**cluster(), "members": []}],
    }
    with pytest.raises(InvalidDocument, match=r"definitions\[1\]\.members"):
        cluster_definitions(bundle)
    good = {**bundle, "definitions": [cluster(), cluster(name="second")]}
    assert [d["name"] for d in cluster_definitions(good)] == ["river-cluster", "second"]
    with pytest.raises(InvalidDocument, match="definitions: List should have at most 50 items"):
        cluster_definitions({**bundle, "definitions": [cluster()] * 51})


def test_circuit_members_rung_and_problems():
    doc = circuit(rungs=(2, 3, 1))
    check_circuit(doc)
    assert rung(doc) == 1
    assert rung(circuit(rungs=())) == 0
    members = circuit_members(doc)
    assert [(m.layer, m.feature_idx, m.strength, m.sign) for m in members] == [
        (1, 4, 30.0, 1),
        (2, 5, 40.0, -1),
        (2, 6, 150.0, 1),
    ]
    for change, problem in [
        ({"saes": []}, "saes: List should have at least 1 item"),
        (
            {
                "members": [
                    {"member_kind": "feature_ref", "feature": {"feature_idx": 1, "strength": 1}}
                ]
            },
            "members[0].layer: required",
        ),
        (
            {"members": [{"layer": 1, "member_kind": "cluster_ref", "expanded_members": []}]},
            "members[0].expanded_members: List should have at least 1 item",
        ),
        (
            {"members": [{"layer": 1, "member_kind": "cluster_ref"}]},
            "members[0].expanded_members: required",
        ),
        (
            {"members": [{"layer": 1, "member_kind": "group"}]},
            "members[0]: member_kind must be feature_ref or cluster_ref",
        ),
        ({"members": [7]}, "members[0]: must be an object, got 7"),
        (
            {"edges": [{"up": {}, "down": {}, "rung": 4}]},
            "edges[0].rung: Input should be 0, 1, 2 or 3, got 4",
        ),
        ({"edges": [{"up": {}, "down": {}, "type": "magic"}]}, "edges[0].type"),
        (
            {"budget": {"layers": {"1": {"intensity": 3}}}},
            "budget.layers.1.intensity: Input should be less than or equal to 2, got 3",
        ),
    ]:
        with pytest.raises(InvalidDocument) as info:
            check_circuit({**circuit(), **change})
        assert problem in info.value.message
