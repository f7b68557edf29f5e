"""Conditional steering end to end (tiny Llama, a standard SAE at layer 1, a saved feature probe):
a request's `steering` with `abort` ends the row at the firing position with content_filter, and
with `when` steers only from the position after it; the verdicts say where. The firing position
is found first from the request's own activations (the probe reads the same residual)."""

from __future__ import annotations

import pytest

from tests.api.clients import MODEL, api, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

LAYER = 1
PROMPT = "The old river runs quickly to the sea, and"
BODY = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
# the threshold sits at least this far from every activation (server reads differ in the last bits)
GAP = 0.01


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    sae_dir = build_saelens(
        tmp_path_factory.mktemp("conditions-sae") / "sae",
        layer=LAYER,
        architecture="standard",
        seed=71,
    )
    process = ServerProcess(
        tmp_path_factory.mktemp("conditions-home"), ["--model", str(tiny_dirs["llama"])]
    ).wait_ready()
    try:
        process.sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        yield process
    finally:
        process.stop()


def read(server, features: list[int] | None, extra: dict | None = None) -> dict:
    """A completion with every position's activations of `features` (all positions, read after
    steering)."""
    ask = {
        "sae_id": server.sae,
        "top_k": 1 if features is None else len(features),
        "positions": "all",
    }
    if features is not None:
        ask["features"] = features
    answer = post(
        server, "/v1/completions", {**BODY, **(extra or {}), "return_sae_activations": ask}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def values(body: dict, feature: int) -> dict[int, float]:
    """Position -> the feature's activation (0 where it is not listed)."""
    out = {}
    for entry in body["millm"]["sae_activations"]["positions"]:
        out[entry["position"]] = next(
            (f["value"] for f in entry["features"] if f["index"] == feature), 0.0
        )
    return out


def tokens(body: dict) -> list[int]:
    return [entry["token_id"] for entry in body["millm"]["sae_activations"]["positions"]]


@pytest.fixture(scope="module")
def firing(server):
    """A feature whose largest activation (past the attention sink) is at a generated position,
    clear of every other value, a saved probe firing there first, and the unsteered answer."""
    plain = read(server, None)
    prompt_length = plain["usage"]["prompt_tokens"]
    candidates = {
        f["index"]
        for entry in plain["millm"]["sae_activations"]["positions"]
        if entry["position"] >= prompt_length
        for f in entry["features"]
    }
    for feature in sorted(candidates):
        body = read(server, [feature])
        by_position = {p: v for p, v in values(body, feature).items() if p >= 1}
        peak_position = max(by_position, key=by_position.get)
        ordered = sorted(by_position.values(), reverse=True)
        if (
            peak_position >= prompt_length
            and ordered[0] - ordered[1] > 2 * GAP
            and peak_position < max(by_position)
        ):
            threshold = (ordered[0] + ordered[1]) / 2
            probe = {
                "name": f"fires-{feature}",
                "detector": {
                    "type": "feature",
                    "sae_id": server.sae,
                    "index": feature,
                    "threshold": threshold,
                },
            }
            assert post(server, "/api/probes", probe).status_code == 201
            return {
                "feature": feature,
                "position": peak_position,
                "prompt_length": prompt_length,
                "plain": body,
                "probe": probe["name"],
            }
    pytest.fail("no feature peaks at a generated position")


def test_a_report_probe_fires_first_at_the_peak(server, firing):
    body = post(server, "/v1/completions", {**BODY, "probes": [firing["probe"]]}).json()
    (verdict,) = body["millm"]["probes"]
    assert (
        verdict["fired"]
        and verdict["first_position"] == firing["position"]
        and verdict["positions"] == [firing["position"]]
    )


def test_abort_ends_the_row_at_the_firing_position(server, firing):
    steering = {"abort": [{"probe": firing["probe"]}]}
    body = read(server, [firing["feature"]], {"steering": steering})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "content_filter"
    kept = firing["position"] - firing["prompt_length"] + 1  # the trigger token included
    assert body["usage"]["completion_tokens"] == kept
    # read up to the trigger, which was fed
    assert tokens(body) == tokens(firing["plain"])[: firing["position"] + 1]
    (verdict,) = body["millm"]["probes"]
    assert (
        verdict["action"] == "abort"
        and verdict["acted_at"] == firing["position"]
        and verdict["source"] == "condition"
    )


def test_when_steers_only_after_the_firing_position(server, firing):
    steer = firing["feature"]
    steering = {
        "steering": [
            {
                "sae_id": server.sae,
                "features": [{"index": steer, "strength": 60.0}],
                "when": {"probe": firing["probe"]},
            }
        ]
    }
    body = read(server, [steer], {"steering": steering})
    p = firing["position"]
    plain_values, steered_values = values(firing["plain"], steer), values(body, steer)
    # token p+1 comes from the logits at p, still unsteered
    assert tokens(body)[: p + 2] == tokens(firing["plain"])[: p + 2]
    for position in range(1, p + 1):
        assert steered_values[position] == pytest.approx(plain_values[position], abs=1e-4)
    # The read is after the edit: from p+1 the feature's activation moves (a random SAE's encoder
    # may even turn it off: 6.9 -> 0 in this fixture), up to p it did not.
    assert abs(steered_values[p + 1] - plain_values[p + 1]) > 1.0
    (verdict,) = body["millm"]["probes"]
    assert verdict["action"] == "steer" and verdict["acted_at"] == p + 1


def test_a_condition_on_an_unknown_probe_is_refused_naming_the_entry(server):
    answer = post(server, "/v1/completions", {**BODY, "steering": {"abort": [{"probe": "nobody"}]}})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "probe_not_found" and "abort[0]" in error["message"], error


def test_conditions_in_the_active_profile(server, firing):
    profile = {"name": "stop-at-peak", "steering": [], "abort": [{"probe": firing["probe"]}]}
    assert post(server, "/api/profiles", profile).status_code == 201
    assert post(server, "/api/profiles/stop-at-peak/activate", {}).status_code == 200
    answer = post(server, "/v1/completions", BODY)
    api(server, "POST", "/api/profiles/deactivate")
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["choices"][0]["finish_reason"] == "content_filter"
    assert body["usage"]["completion_tokens"] == firing["position"] - firing["prompt_length"] + 1
    api(server, "DELETE", "/api/profiles/stop-at-peak")


def own_probe(server, firing) -> dict:
    """The saved probe's detector, as a spec defines it for itself."""
    return api(server, "GET", f"/api/probes/{firing['probe']}").json()["document"]["detector"]


def test_a_condition_that_defines_its_own_probe_acts_as_the_saved_one(server, firing):
    detector = own_probe(server, firing)
    saved = read(server, [firing["feature"]], {"steering": {"abort": [{"probe": firing["probe"]}]}})
    # a name no probe has: the definition is all there is
    own = {"abort": [{"probe": "its-own", "detector": detector}]}
    body = read(server, [firing["feature"]], {"steering": own})
    assert body["choices"][0]["finish_reason"] == "content_filter"
    assert body["usage"]["completion_tokens"] == saved["usage"]["completion_tokens"]
    assert tokens(body) == tokens(saved)
    (verdict,) = body["millm"]["probes"]
    assert verdict["name"] == "its-own" and verdict["acted_at"] == firing["position"]
    steer = {
        "steering": [
            {
                "sae_id": server.sae,
                "features": [{"index": firing["feature"], "strength": 60.0}],
                "when": {"probe": "its-own", "detector": detector},
            }
        ]
    }
    body = read(server, [firing["feature"]], {"steering": steer})
    (verdict,) = body["millm"]["probes"]
    assert verdict["action"] == "steer" and verdict["acted_at"] == firing["position"] + 1


def test_a_defined_probe_shadows_a_saved_one_of_its_name(server, firing):
    # the saved probe fires at the peak; this definition (above every activation) never does
    detector = {**own_probe(server, firing), "threshold": 1e6}
    spec = {"abort": [{"probe": firing["probe"], "detector": detector}]}
    body = post(server, "/v1/completions", {**BODY, "steering": spec}).json()
    assert body["choices"][0]["finish_reason"] == "length", body
    (verdict,) = body["millm"]["probes"]
    assert not verdict["fired"]


def test_one_name_with_two_detectors_is_refused(server, firing):
    detector = own_probe(server, firing)
    spec = {
        "steering": [
            {
                "sae_id": server.sae,
                "features": [{"index": 0, "strength": 1.0}],
                "when": {"probe": "twice", "detector": detector},
            }
        ],
        "abort": [{"probe": "twice", "detector": {**detector, "threshold": 1e6}}],
    }
    answer = post(server, "/v1/completions", {**BODY, "steering": spec})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "abort[0].detector" in error["message"] and "twice" in error["message"], error


def test_a_defined_probe_is_checked_like_a_saved_one(server):
    bad = {"type": "feature", "sae_id": server.sae, "index": 0}  # neither threshold nor percentile
    answer = post(
        server,
        "/v1/completions",
        {**BODY, "steering": {"abort": [{"probe": "p", "detector": bad}]}},
    )
    assert answer.status_code == 400
    assert "abort[0].detector" in answer.json()["error"]["param"], answer.json()
    wide = {"type": "feature", "sae_id": server.sae, "index": 10**6, "threshold": 1.0}
    answer = post(
        server,
        "/v1/completions",
        {**BODY, "steering": {"abort": [{"probe": "p", "detector": wide}]}},
    )
    assert answer.status_code == 400 and "abort[0]" in answer.json()["error"]["message"]
