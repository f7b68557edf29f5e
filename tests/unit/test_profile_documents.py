"""Profile documents: the format's rules, whole-document refusal listing every problem, bundles,
version 2's operators, conditions, vectors and aborts, and version 1 read as version 2."""

import re

import pytest

from millm.errors import InvalidRequest
from millm.formats.profiles import (
    InvalidProfile,
    bundle,
    validate_import,
    validate_profile,
    validate_spec,
)

GOOD = {
    "name": "calm-sea",
    "description": "d",
    "steering": [{"sae_id": "sae_a", "layer": 3, "features": [{"index": 1, "strength": 5}]}],
}


def test_good_document_is_normalised():
    doc = validate_profile(GOOD)
    assert doc["kind"] == "millm.profile" and doc["version"] == 2
    assert doc["steering"][0]["features"][0] == {"index": 1, "op": "add", "strength": 5.0}
    assert set(doc) == {
        "kind",
        "version",
        "name",
        "description",
        "steering",
    }  # no empty vectors or abort


def test_a_version_1_document_means_the_same_as_version_2_with_every_op_add():
    v1 = {**GOOD, "kind": "millm.profile", "version": 1}
    assert (
        validate_profile(v1) == validate_profile({**GOOD, "version": 2}) == validate_profile(GOOD)
    )
    # canonical is a fixed point
    assert validate_profile(validate_profile(v1)) == validate_profile(v1)


def test_version_2_operators_conditions_vectors_and_aborts():
    doc = validate_profile(
        {
            "name": "ops",
            "version": 2,
            "steering": [
                {
                    "sae_id": "sae_a",
                    "layer": 12,
                    "features": [
                        {"index": 1403, "op": "add", "strength": 40},
                        {"index": 7, "op": "clamp", "value": 3},
                        {"index": 9, "op": "ablate"},
                        {"index": 11, "op": "cap", "value": 5},
                    ],
                },
                {
                    "sae_id": "sae_a",
                    "features": [{"index": 2, "strength": 8}],
                    "when": {"probe": "mentions-dinner", "tokens": None},
                },
            ],
            "vectors": [
                {"vector_id": "vec_1", "strength": 8.0, "when": None},
                {
                    "vector_id": "vec_2",
                    "op": "cap",
                    "value": 1.5,
                    "when": {"probe": "p", "tokens": 4},
                },
            ],
            "abort": [{"probe": "some-probe"}],
        }
    )
    assert [f["op"] for f in doc["steering"][0]["features"]] == ["add", "clamp", "ablate", "cap"]
    assert doc["steering"][0]["features"][1:] == [
        {"index": 7, "op": "clamp", "value": 3.0},
        {"index": 9, "op": "ablate"},
        {"index": 11, "op": "cap", "value": 5.0},
    ]
    # tokens null: the rest of the row
    assert doc["steering"][1]["when"] == {"probe": "mentions-dinner"}
    assert doc["vectors"] == [
        {"vector_id": "vec_1", "op": "add", "strength": 8.0},
        {"vector_id": "vec_2", "op": "cap", "value": 1.5, "when": {"probe": "p", "tokens": 4}},
    ]
    assert doc["abort"] == [{"probe": "some-probe"}]
    assert validate_profile(doc) == doc


def feature(**fields):
    return {**GOOD, "steering": [{"sae_id": "s", "features": [fields]}]}


@pytest.mark.parametrize(
    "doc, problem",
    [
        (feature(index=1, op="clamp"), "steering[0].features[0].value: required"),
        (feature(index=1, op="cap"), "steering[0].features[0].value: required"),
        (feature(index=1, op="add", value=3), "steering[0].features[0].strength: required"),
        (
            feature(index=1, op="add", value=3),
            "steering[0].features[0].value: value is for op clamp and cap only",
        ),
        (
            feature(index=1, op="clamp", value=3, strength=2),
            "steering[0].features[0].strength: strength is for op add only",
        ),
        (feature(index=1, op="ablate", value=0), "value: value is for op clamp and cap only"),
        (
            feature(index=1, op="clamp", value=-1),
            "steering[0].features[0].value: Input should be greater than or equal to 0, got -1",
        ),
        (
            feature(index=1, op="multiply", value=1),
            "steering[0].features[0]: op must be one of add, clamp, ablate, cap",
        ),
        (feature(index=1, op=None, strength=1), "op must be one of add, clamp, ablate, cap"),
        (
            feature(index=1, op="clamp", value=float("inf")),
            "value: Input should be a finite number",
        ),
        (
            {**GOOD, "version": 1, "abort": [{"probe": "p"}]},
            "document: version 1 documents only add features",
        ),
        ({**feature(index=1, op="ablate"), "version": 1}, "version 1 documents only add features"),
        (
            {**GOOD, "steering": [{**GOOD["steering"][0], "when": {"probe": "p", "tokens": 0}}]},
            "steering[0].when.tokens: Input should be greater than 0, got 0",
        ),
        (
            {**GOOD, "steering": [{**GOOD["steering"][0], "when": {"probe": "", "tokens": 3}}]},
            "steering[0].when.probe: String should have at least 1 character",
        ),
        (
            {**GOOD, "steering": [{**GOOD["steering"][0], "when": {"probe": 7}}]},
            "steering[0].when.probe: Input should be a valid string",
        ),
        (
            {**GOOD, "steering": [{**GOOD["steering"][0], "when": {"probe": "p", "tokens": True}}]},
            "steering[0].when.tokens: Input should be a valid integer, got true",
        ),
        (
            {**GOOD, "steering": [{**GOOD["steering"][0], "when": {"probe": "p"}}] * 2},
            "steering: sae_a (when p) appears twice",
        ),
        (
            {**GOOD, "vectors": [{"vector_id": "v", "op": "clamp", "value": 1}]},
            "vectors[0]: a vector's op must be add or cap",
        ),
        (
            {**GOOD, "vectors": [{"vector_id": "v", "strength": 201}]},
            "vectors[0].strength: Input should be less than or equal to 200",
        ),
        (
            {**GOOD, "vectors": [{"vector_id": 5, "strength": 1}]},
            "vectors[0].vector_id: Input should be a valid string",
        ),
        (
            {
                **GOOD,
                "vectors": [{"vector_id": "v", "strength": 1}, {"vector_id": "v", "strength": 2}],
            },
            "vectors: v appears twice",
        ),
        (
            {**GOOD, "abort": [{"probe": "p"}, {"probe": "p"}]},
            "abort: probe p appears twice in abort",
        ),
        ({**GOOD, "abort": [{}]}, "abort[0].probe: required"),
    ],
)
def test_each_version_2_problem_is_named(doc, problem):
    with pytest.raises(InvalidProfile) as info:
        validate_profile(doc)
    assert problem in info.value.message


def test_a_request_spec_is_a_documents_steering_part():
    spec = validate_spec(
        {
            "steering": [{"sae_id": "s", "features": [{"index": 2, "op": "clamp", "value": 1}]}],
            "abort": [{"probe": "p"}],
        }
    )
    assert spec == {
        "steering": [{"sae_id": "s", "features": [{"index": 2, "op": "clamp", "value": 1.0}]}],
        "abort": [{"probe": "p"}],
    }
    with pytest.raises(InvalidRequest) as info:
        validate_spec({"steering": [{"sae_id": "s", "features": [{"index": 2, "op": "clamp"}]}]})
    assert (
        info.value.param == "steering.steering[0].features[0].value"
        and "required" in info.value.message
    )


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"name": ""}, "name:"),
        ({"name": "x" * 121}, "name:"),
        ({"kind": "other"}, "kind: Input should be 'millm.profile', got \"other\""),
        ({"version": 3}, "version: Input should be 1 or 2, got 3"),
        ({"version": True}, "version: Input should be 1 or 2, got true"),
        ({"description": 5}, "description:"),
        ({"steering": {}}, "steering: must be a list"),
        ({"steering": [{"features": []}]}, "steering[0].sae_id: required"),
        (
            {"steering": [{"sae_id": "s", "features": [{"index": -1, "strength": 1}]}]},
            "steering[0].features[0].index",
        ),
        (
            {"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": 201}]}]},
            "steering[0].features[0].strength: Input should be less than or equal to 200, got 201",
        ),
        (
            {"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": True}]}]},
            "strength: Input should be a valid number, got true",
        ),
        (
            {
                "steering": [
                    {
                        "sae_id": "s",
                        "features": [{"index": 1, "strength": 1}, {"index": 1, "strength": 2}],
                    }
                ]
            },
            "steering[0].features: feature 1 appears twice",
        ),
        (
            {"steering": [{"sae_id": "s", "features": []}, {"sae_id": "s", "features": []}]},
            "steering: s appears twice; give one entry per SAE",
        ),
        (
            {"steering": [{"sae_id": "s", "layer": -2, "features": []}]},
            "steering[0].layer: Input should be greater than or equal to 0, got -2",
        ),
        (
            {"steering": [{"sae_id": {}, "features": []}, {"sae_id": [], "features": []}]},
            "steering[1].sae_id: Input should be a valid string",
        ),
        (
            {"steering": [{"sae_id": "s", "features": [{"index": {}, "strength": 1}]}]},
            "steering[0].features[0].index: Input should be a valid integer",
        ),
        (
            {"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": float("nan")}]}]},
            "strength: Input should be a finite number",
        ),
        ({"steering": "x"}, 'steering: must be a list, got "x"'),
    ],
)
def test_each_problem_is_named(change, problem):
    with pytest.raises(InvalidProfile) as info:
        validate_profile({**GOOD, **change})
    assert problem in info.value.message and info.value.status == 400


def test_every_problem_is_listed_at_once():
    with pytest.raises(InvalidProfile) as info:
        validate_profile(
            {
                "name": "",
                "steering": [{"sae_id": "", "features": [{"index": "x", "strength": 999}]}],
            }
        )
    assert info.value.message.count(";") >= 3


def test_unknown_keys_are_dropped_and_a_non_object_is_named():
    assert validate_profile({**GOOD, "colour": "blue"}) == validate_profile(GOOD)
    with pytest.raises(InvalidProfile, match="invalid profile: document: must be an object"):
        validate_profile([GOOD])


def test_bundles_are_all_or_nothing():
    docs = validate_import(bundle([GOOD, {**GOOD, "name": "second"}]))
    assert [d["name"] for d in docs] == ["calm-sea", "second"]
    with pytest.raises(InvalidProfile, match=r"profiles\[1\].name"):
        validate_import(bundle([GOOD, {**GOOD, "name": ""}]))
    with pytest.raises(InvalidProfile, match="names appear twice"):
        validate_import(bundle([GOOD, GOOD]))
    with pytest.raises(InvalidProfile, match="profiles: List should have at least 1 item"):
        validate_import(bundle([]))


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"features": [{"index": 3, "strength": 30.0}]}, "steering.features"),
        (
            {
                "steering": [
                    {"sae_id": "sae_x", "features": [{"index": 3, "strength": 3.0, "strenght": 2}]}
                ]
            },
            "steering.steering[0].features[0].strenght",
        ),
    ],
)
def test_a_request_steering_with_an_unknown_key_is_refused_not_dropped(spec, where):
    """A key the document does not know would otherwise be dropped and the request answered
    unsteered."""
    with pytest.raises(InvalidRequest, match=re.escape(where) + ": unknown field"):
        validate_spec(spec)
