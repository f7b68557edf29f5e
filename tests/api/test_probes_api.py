"""/api/probes on a live server (tiny Llama, a TopK SAE attached at layer 1, a second SAE registered
but not attached): create, read, update, delete, import and export, activation and its checks
against the loaded model, and everything surviving a restart."""

from __future__ import annotations

import pytest

from tests.api.clients import api, error, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

HIDDEN, LAYERS = 64, 4  # the tiny Llama's residual width and depth


def feature_probe(name: str, sae_id: str, **detector) -> dict:
    return {
        "name": name,
        "description": f"{name} probe",
        "detector": {"type": "feature", "sae_id": sae_id, "index": 5, "threshold": 1.5, **detector},
    }


def linear_probe(name: str, **detector) -> dict:
    weights = [((i * 7) % 11 - 5) / 10 for i in range(HIDDEN)]
    return {
        "name": name,
        "detector": {
            "type": "linear",
            "layer": 2,
            "weights": weights,
            "bias": -0.25,
            "threshold": 0.7,
            **detector,
        },
    }


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("probes-home")


@pytest.fixture(scope="module")
def server(tiny_dirs, home, tmp_path_factory):
    base = tmp_path_factory.mktemp("probes-saes")
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])]).wait_ready()
    try:
        process.sae = post(
            process, "/api/saes", {"path": str(build_saelens(base / "main", layer=1, seed=81))}
        ).json()["id"]
        process.loose = post(
            process, "/api/saes", {"path": str(build_saelens(base / "loose", layer=2, seed=82))}
        ).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        yield process
    finally:
        process.stop()


@pytest.fixture
def clean(server):
    for probe in api(server, "GET", "/api/probes").json()["data"]:
        api(server, "DELETE", f"/api/probes/{probe['id']}")
    return server


def test_create_read_update_delete(clean):
    created = post(clean, "/api/probes", feature_probe("pirate-talk", clean.sae))
    assert created.status_code == 201, created.text
    probe = created.json()
    assert (
        probe["object"] == "probe" and probe["id"].startswith("probe_") and probe["active"] is False
    )
    document = probe["document"]
    assert document == {
        "kind": "millm.probe",
        "version": 1,
        "name": "pirate-talk",
        "description": "pirate-talk probe",
        "detector": {"type": "feature", "sae_id": clean.sae, "index": 5, "threshold": 1.5},
    }
    assert api(clean, "GET", "/api/probes/pirate-talk").json() == probe
    assert api(clean, "GET", f"/api/probes/{probe['id']}").json() == probe
    assert [p["name"] for p in api(clean, "GET", "/api/probes").json()["data"]] == ["pirate-talk"]

    weighted = {
        "type": "weighted",
        "sae_id": clean.sae,
        "features": [{"index": 1, "weight": 0.5}, {"index": 9, "weight": -2}],
        "threshold": 3,
    }
    updated = api(
        clean, "PUT", "/api/probes/pirate-talk", json={"name": "pirate-mix", "detector": weighted}
    )
    assert updated.status_code == 200, updated.text
    body = updated.json()
    assert (
        body["id"] == probe["id"]
        and body["name"] == "pirate-mix"
        and body["document"]["description"] == "pirate-talk probe"
    )
    assert body["document"]["detector"] == {
        **weighted,
        "features": [{"index": 1, "weight": 0.5}, {"index": 9, "weight": -2.0}],
        "threshold": 3.0,
    }
    error(api(clean, "GET", "/api/probes/pirate-talk"), 404, "probe_not_found")

    deleted = api(clean, "DELETE", "/api/probes/pirate-mix")
    assert deleted.json() == {"id": probe["id"], "name": "pirate-mix", "deleted": True}
    assert api(clean, "GET", "/api/probes").json()["data"] == []


@pytest.mark.parametrize(
    "body, param, needle",
    [
        (
            {"name": "x", "detector": {"type": "feature", "sae_id": "s", "index": 1}},
            "detector",
            "give threshold (an activation) or percentile",
        ),
        (
            {
                "name": "x",
                "detector": {
                    "type": "feature",
                    "sae_id": "s",
                    "index": 1,
                    "threshold": 1,
                    "percentile": 90,
                },
            },
            "detector",
            "not both",
        ),
        (
            {
                "name": "x",
                "detector": {"type": "feature", "sae_id": "s", "index": 1, "percentile": 99.5},
            },
            "detector.percentile",
            "a whole percent from 1 to 99",
        ),
        (
            {
                "name": "x",
                "detector": {"type": "feature", "sae_id": "s", "index": 1, "percentile": 100},
            },
            "detector.percentile",
            "a whole percent from 1 to 99",
        ),
        (
            {
                "name": "x",
                "detector": {"type": "feature", "sae_id": "s", "index": 1, "threshold": 0},
            },
            "detector.threshold",
            "greater than 0",
        ),
        (
            {
                "name": "x",
                "detector": {"type": "linear", "layer": 1, "weights": [1.0], "threshold": 1},
            },
            "detector.threshold",
            "less than 1",
        ),
        (
            {
                "name": "x",
                "detector": {
                    "type": "linear",
                    "layer": 1,
                    "weights": [1.0],
                    "hook_piont": "resid_pre",
                },
            },
            "detector.hook_piont",
            "unknown key",
        ),
        (
            {"name": "x", "detector": {"type": "cosine"}},
            "detector",
            "does not match any of the expected tags",
        ),
        (
            {"name": "(bad)", "detector": {"type": "linear", "layer": 1, "weights": [1.0]}},
            "name",
            "1-120 characters",
        ),
    ],
)
def test_bad_documents_are_refused_naming_the_field(clean, body, param, needle):
    refused = error(post(clean, "/api/probes", body), 400)
    assert refused["param"] == param and needle in refused["message"], refused
    assert api(clean, "GET", "/api/probes").json()["data"] == []


def test_names_are_unique_and_updates_validated_whole(clean):
    assert post(clean, "/api/probes", feature_probe("one", clean.sae)).status_code == 201
    assert post(clean, "/api/probes", linear_probe("two")).status_code == 201
    error(post(clean, "/api/probes", linear_probe("one")), 409, "probe_exists")
    error(api(clean, "PUT", "/api/probes/two", json={"name": "one"}), 409, "probe_exists")
    refused = error(
        api(
            clean,
            "PUT",
            "/api/probes/one",
            json={"detector": {"type": "feature", "sae_id": clean.sae, "index": 5}},
        ),
        400,
    )
    assert "threshold" in refused["message"]
    assert api(clean, "GET", "/api/probes/one").json()["document"]["detector"]["threshold"] == 1.5


def test_export_and_import_round_trip(clean):
    for body in (
        feature_probe("alpha", clean.sae, percentile=90, threshold=None),
        linear_probe("beta"),
    ):
        body["detector"] = {k: v for k, v in body["detector"].items() if v is not None}
        assert post(clean, "/api/probes", body).status_code == 201, body
    bundle = api(clean, "GET", "/api/probes/export").json()
    assert bundle["kind"] == "millm.probe-bundle" and bundle["version"] == 1
    assert [p["name"] for p in bundle["probes"]] == ["alpha", "beta"]
    assert api(clean, "GET", "/api/probes/alpha/export").json() == bundle["probes"][0]

    error(post(clean, "/api/probes/import", bundle), 409, "probe_exists")
    renamed = post(clean, "/api/probes/import?on_conflict=rename", bundle)
    assert renamed.status_code == 201, renamed.text
    assert [p["name"] for p in renamed.json()["data"]] == ["alpha-2", "beta-2"]
    assert [p["document"]["detector"] for p in renamed.json()["data"]] == [
        p["detector"] for p in bundle["probes"]
    ]

    for probe in api(clean, "GET", "/api/probes").json()["data"]:
        api(clean, "DELETE", f"/api/probes/{probe['id']}")
    assert post(clean, "/api/probes/import", bundle).status_code == 201
    assert api(clean, "GET", "/api/probes/export").json() == bundle
    single = post(clean, "/api/probes/import?on_conflict=rename", bundle["probes"][1])
    assert [p["name"] for p in single.json()["data"]] == ["beta-2"]

    broken = {
        **bundle,
        "probes": [
            bundle["probes"][0],
            {
                **bundle["probes"][1],
                "name": "gamma",
                "detector": {"type": "linear", "layer": 1, "weights": []},
            },
        ],
    }
    refused = error(
        post(clean, "/api/probes/import?on_conflict=rename", broken), 400, "invalid_probe"
    )
    assert "probes[1].detector.weights" in refused["message"]
    # nothing of it was stored
    assert "gamma" not in {p["name"] for p in api(clean, "GET", "/api/probes").json()["data"]}


def test_activation_is_checked_against_the_loaded_model(clean):
    post(clean, "/api/probes", feature_probe("loose", clean.loose))
    # Past the width is refused when written (test_a_feature_past_a_registered_saes_width_...).
    error(post(clean, "/api/probes", feature_probe("wide", clean.sae, index=128)), 400)
    post(
        clean,
        "/api/probes",
        {
            **feature_probe("calibrated", clean.sae, percentile=90),
            "detector": {"type": "feature", "sae_id": clean.sae, "index": 5, "percentile": 90},
        },
    )
    post(clean, "/api/probes", linear_probe("narrow", weights=[0.5] * 32))
    post(clean, "/api/probes", linear_probe("deep", layer=LAYERS))
    post(
        clean,
        "/api/probes",
        linear_probe(
            "elsewhere",
            training={
                "model": "another-model",
                "positives": 2,
                "negatives": 2,
                "held_out": 2,
                "accuracy": 1.0,
                "trained_at": 1.0,
            },
        ),
    )
    for name, status, code, param in [
        ("loose", 400, "sae_not_attached", "detector.sae_id"),
        ("calibrated", 400, "not_calibrated", "detector.percentile"),
        ("narrow", 400, "invalid_parameter", "detector.weights"),
        ("deep", 400, "invalid_parameter", "detector.layer"),
        ("elsewhere", 400, "probe_model_mismatch", "detector.training.model"),
    ]:
        refused = error(api(clean, "POST", f"/api/probes/{name}/activate"), status, code)
        assert refused["param"] == param, refused
        assert api(clean, "GET", f"/api/probes/{name}").json()["active"] is False

    post(clean, "/api/probes", feature_probe("fits", clean.sae))
    post(clean, "/api/probes", linear_probe("linear-fits"))
    for name in ("fits", "linear-fits"):
        activated = api(clean, "POST", f"/api/probes/{name}/activate")
        assert activated.status_code == 200, activated.text
        assert activated.json()["probe"]["active"] is True and activated.json()["checked"] is True
    # An active probe's detector may only change to one that still fits.
    error(
        api(
            clean,
            "PUT",
            "/api/probes/fits",
            json={
                "detector": {"type": "feature", "sae_id": clean.loose, "index": 5, "threshold": 1}
            },
        ),
        400,
        "sae_not_attached",
    )
    assert (
        api(clean, "PUT", "/api/probes/fits", json={"description": "still fits"}).status_code == 200
    )
    assert api(clean, "POST", "/api/probes/fits/deactivate").json()["probe"]["active"] is False
    assert [p["name"] for p in api(clean, "GET", "/api/probes").json()["data"] if p["active"]] == [
        "linear-fits"
    ]


def test_probes_and_which_are_active_survive_a_restart(clean, home, tiny_dirs):
    post(clean, "/api/probes", feature_probe("kept", clean.sae))
    post(clean, "/api/probes", linear_probe("watching"))
    assert api(clean, "POST", "/api/probes/watching/activate").status_code == 200
    before = api(clean, "GET", "/api/probes").json()
    clean.stop()
    again = ServerProcess(home, ["--model", str(tiny_dirs["llama"])]).wait_ready()
    clean.__dict__.update({k: v for k, v in again.__dict__.items()})
    assert api(clean, "GET", "/api/probes").json() == before
    assert [p["name"] for p in before["data"] if p["active"]] == ["watching"]


def test_a_feature_past_a_registered_saes_width_is_refused_when_written(clean):
    width = api(clean, "GET", f"/api/saes/{clean.loose}").json()["d_sae"]
    past = feature_probe("past", clean.loose, index=99_999)
    refused = error(post(clean, "/api/probes", past), 400, "invalid_feature_index")
    assert refused["param"] == "detector.index" and f"{width} features" in refused["message"]
    weighted = {
        "name": "weighted-past",
        "detector": {
            "type": "weighted",
            "sae_id": clean.sae,
            "features": [{"index": 1, "weight": 1.0}, {"index": width, "weight": 0.5}],
            "threshold": 1.0,
        },
    }
    refused = error(post(clean, "/api/probes", weighted), 400, "invalid_feature_index")
    assert refused["param"] == "detector.features[1].index"
    assert post(clean, "/api/probes", feature_probe("inside", clean.sae)).status_code == 201
    moved = {"detector": {**feature_probe("x", clean.sae)["detector"], "index": width}}
    refused = error(api(clean, "PUT", "/api/probes/inside", json=moved), 400)
    assert refused["code"] == "invalid_feature_index" and refused["param"] == "detector.index"
    bundle = {"kind": "millm.probe-bundle", "probes": [feature_probe("a", clean.sae), past]}
    refused = error(post(clean, "/api/probes/import", bundle), 400, "invalid_feature_index")
    assert refused["param"] == "probes[1].detector.index"
    assert [p["name"] for p in api(clean, "GET", "/api/probes").json()["data"]] == ["inside"]
    assert api(clean, "GET", "/api/probes/inside").json()["document"]["detector"]["index"] == 5
    # A portable document naming an SAE this server has not registered is kept, checked when it
    # binds.
    elsewhere = feature_probe("elsewhere", "sae_000000000000", index=99_999)
    assert post(clean, "/api/probes", elsewhere).status_code == 201
