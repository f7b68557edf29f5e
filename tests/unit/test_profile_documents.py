"""Profile documents: the format's rules, whole-document refusal listing every problem, bundles."""

import pytest

from millm.interp.profiles import InvalidProfile, bundle, profile_strengths, validate_import, validate_profile

GOOD = {"name": "calm-sea", "description": "d", "steering": [{"sae_id": "sae_a", "layer": 3, "features": [{"index": 1, "strength": 5}]}]}


def test_good_document_is_normalised():
    doc = validate_profile(GOOD)
    assert doc["kind"] == "millm.profile" and doc["version"] == 1
    assert doc["steering"][0]["features"][0] == {"index": 1, "strength": 5.0}
    assert profile_strengths(doc) == {"sae_a": {1: 5.0}}


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"name": ""}, "name:"),
        ({"name": "x" * 121}, "name:"),
        ({"kind": "other"}, "kind: Input should be 'millm.profile', got \"other\""),
        ({"version": 2}, "version: Input should be 1, got 2"),
        ({"version": True}, "version: Input should be 1, got true"),
        ({"description": 5}, "description:"),
        ({"steering": {}}, "steering: must be a list"),
        ({"steering": [{"features": []}]}, "steering[0].sae_id: required"),
        ({"steering": [{"sae_id": "s", "features": [{"index": -1, "strength": 1}]}]}, "steering[0].features[0].index"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": 201}]}]}, "steering[0].features[0].strength: Input should be less than or equal to 200, got 201"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": True}]}]}, "strength: Input should be a valid number, got true"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": 1}, {"index": 1, "strength": 2}]}]}, "steering[0].features: feature 1 appears twice"),
        ({"steering": [{"sae_id": "s", "features": []}, {"sae_id": "s", "features": []}]}, "steering: s appears twice; give one entry per SAE"),
        ({"steering": [{"sae_id": "s", "layer": -2, "features": []}]}, "steering[0].layer: Input should be greater than or equal to 0, got -2"),
        ({"steering": [{"sae_id": {}, "features": []}, {"sae_id": [], "features": []}]}, "steering[1].sae_id: Input should be a valid string"),
        ({"steering": [{"sae_id": "s", "features": [{"index": {}, "strength": 1}]}]}, "steering[0].features[0].index: Input should be a valid integer"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": float("nan")}]}]}, "strength: Input should be a finite number"),
        ({"steering": "x"}, "steering: must be a list, got \"x\""),
    ],
)
def test_each_problem_is_named(change, problem):
    with pytest.raises(InvalidProfile) as info:
        validate_profile({**GOOD, **change})
    assert problem in info.value.message and info.value.status == 400


def test_every_problem_is_listed_at_once():
    with pytest.raises(InvalidProfile) as info:
        validate_profile({"name": "", "steering": [{"sae_id": "", "features": [{"index": "x", "strength": 999}]}]})
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
