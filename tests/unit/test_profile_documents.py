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
        ({"kind": "other"}, "kind: must be 'millm.profile'"),
        ({"version": 2}, "version: 2 is not a supported version"),
        ({"description": 5}, "description:"),
        ({"steering": {}}, "steering: must be a list"),
        ({"steering": [{"features": []}]}, "steering[0].sae_id: required"),
        ({"steering": [{"sae_id": "s", "features": [{"index": -1, "strength": 1}]}]}, "steering[0].features[0].index"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": 201}]}]}, "outside ±200"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": True}]}]}, "a finite number"),
        ({"steering": [{"sae_id": "s", "features": [{"index": 1, "strength": 1}, {"index": 1, "strength": 2}]}]}, "feature 1 appears twice"),
        ({"steering": [{"sae_id": "s", "features": []}, {"sae_id": "s", "features": []}]}, "appears twice; give one entry per SAE"),
        ({"steering": [{"sae_id": "s", "layer": -2, "features": []}]}, "layer: a non-negative integer"),
        ({"steering": [{"sae_id": {}, "features": []}, {"sae_id": [], "features": []}]}, "steering[1].sae_id: required string"),
        ({"steering": [{"sae_id": "s", "features": [{"index": {}, "strength": 1}]}]}, "features[0].index: a non-negative integer"),
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


def test_bundles_are_all_or_nothing():
    docs = validate_import(bundle([GOOD, {**GOOD, "name": "second"}]))
    assert [d["name"] for d in docs] == ["calm-sea", "second"]
    with pytest.raises(InvalidProfile, match=r"profiles\[1\].name"):
        validate_import(bundle([GOOD, {**GOOD, "name": ""}]))
    with pytest.raises(InvalidProfile, match="names appear twice"):
        validate_import(bundle([GOOD, GOOD]))
    with pytest.raises(InvalidProfile, match="1 to 500"):
        validate_import(bundle([]))
