"""SAELens release names resolved through the registry sae-lens ships, and the --sae grammar."""

import pytest

from millm.errors import InvalidRequest, SAEFormatError
from millm.interp import sae_releases
from millm.kernel.model.sae_specs import parse_sae_spec

pytest.importorskip("sae_lens")


def test_a_canonical_gemma_scope_id_resolves_to_its_folder_and_neuronpedia_id():
    found = sae_releases.find("gemma-scope-2b-pt-res-canonical", "layer_12/width_16k/canonical")
    assert found.repo == "google/gemma-scope-2b-pt-res"
    assert found.path.startswith("layer_12/width_16k/average_l0_")
    assert found.model == "gemma-2-2b"
    assert found.neuronpedia_id == "gemma-2-2b/12-gemmascope-res-16k"
    assert found.layout == "Gemma Scope"


def test_every_release_millm_reads_resolves_and_the_rest_are_refused_by_name():
    readable = refused = 0
    for name, entry in sae_releases.registry().items():
        first = str(entry["saes"][0]["id"])
        if entry.get("conversion_func") in sae_releases.READ:
            assert sae_releases.find(name, first).repo == entry["repo_id"]
            readable += 1
        else:
            with pytest.raises(SAEFormatError, match=entry["conversion_func"]):
                sae_releases.find(name, first)
            refused += 1
    assert readable > 100 and refused > 0


def test_unknown_names_suggest_the_nearest():
    with pytest.raises(
        InvalidRequest, match="did you mean 'gemma-scope-2b-pt-res-canonical'"
    ) as caught:
        sae_releases.find("gemma-scope-2b-pt-res-canonicall", "layer_12/width_16k/canonical")
    assert caught.value.code == "unknown_sae_release" and caught.value.param == "release"
    with pytest.raises(InvalidRequest, match="layer_12/width_16k/canonical") as caught:
        sae_releases.find("gemma-scope-2b-pt-res-canonical", "layer_12/width_16k/canonicl")
    assert (
        caught.value.code == "unknown_sae_id"
        and "releases/gemma-scope-2b-pt-res-canonical" in caught.value.message
    )


def test_releases_for_a_model():
    listed = sae_releases.releases_view("gemma-2-2b")
    names = {row["release"] for row in listed}
    assert "gemma-scope-2b-pt-res-canonical" in names
    assert all("gemma-2-2b" in row["model"].lower() for row in listed)
    view = sae_releases.release_view("gemma-scope-2b-pt-res-canonical")
    assert view["readable"] and any(
        s["sae_id"] == "layer_12/width_16k/canonical" for s in view["saes"]
    )


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        (
            "gemma-scope-2b-pt-res-canonical:layer_12/width_16k/canonical",
            {
                "release": "gemma-scope-2b-pt-res-canonical",
                "sae_id": "layer_12/width_16k/canonical",
            },
        ),
        (
            "google/gemma-scope-2b-pt-res:layer_12/width_16k/average_l0_82",
            {
                "repo": "google/gemma-scope-2b-pt-res",
                "repo_path": "layer_12/width_16k/average_l0_82",
            },
        ),
        ("acme/saes:layer_1@v2", {"repo": "acme/saes", "repo_path": "layer_1", "revision": "v2"}),
        ("acme/saes", {"repo": "acme/saes", "repo_path": None}),
    ],
)
def test_sae_spec_grammar(text, fields):
    spec = parse_sae_spec(text)
    assert {key: getattr(spec, key) for key in fields} == fields


def test_a_local_path_wins_and_nonsense_is_refused(tmp_path):
    assert parse_sae_spec(str(tmp_path)).path == str(tmp_path)
    with pytest.raises(InvalidRequest, match="RELEASE:SAE_ID"):
        parse_sae_spec("no such thing")
