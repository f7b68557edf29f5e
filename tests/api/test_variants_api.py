"""Steered variants (issue 34, beyond the spec): names any /v1 client uses as models, each a base
model and its steering; served by the base, steered as a request with that steering is, scored
unsteered unless the variant says steered, refused by name when its steering no longer fits,
kept across a restart."""

from __future__ import annotations

import pytest

from tests.api.clients import MODEL, api, error, llama_with_sae, post
from tests.support.server import ServerProcess
from tests.support.steered_forward import steered_logprobs
from tests.support.steering_header import member

USER = [{"role": "user", "content": "Tell me about the city."}]
PROMPT = "The capital of France is"
LAYER, INDEX, STRENGTH = 1, 3, 40.0


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    """The tiny Llama with an SAE on block LAYER attached."""
    with llama_with_sae(tiny_dirs, tmp_path_factory.mktemp("variants"), seed=21) as process:
        yield process


@pytest.fixture(scope="module")
def sae_dir(server):
    return server.sae_dir


@pytest.fixture(scope="module")
def sae_id(server):
    return server.sae


def spec(sae_id: str, strength: float = STRENGTH, index: int = INDEX) -> dict:
    return {
        "steering": [
            {
                "sae_id": sae_id,
                "layer": LAYER,
                "features": [{"index": index, "op": "add", "strength": strength}],
            }
        ]
    }


@pytest.fixture
def variant(server, sae_id):
    """A fresh variant `pirate` of the tiny Llama steered by one feature; deleted afterwards."""
    body = {"name": "pirate", "base": MODEL, "steering": spec(sae_id)}
    created = api(server, "POST", "/api/variants", json=body)
    assert created.status_code == 201, created.text
    yield created.json()
    api(server, "DELETE", "/api/variants/pirate")


def chat(server, model: str, **extra) -> dict:
    body = {"model": model, "messages": USER, "max_tokens": 10, "temperature": 0, **extra}
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return {**response.json(), "steering": response.headers["x-millm-steering"]}


def echo_logprobs(server, model: str) -> list[float]:
    body = {"model": model, "prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 0}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["token_logprobs"][1:]


def test_a_variant_is_listed_as_a_model_with_its_base_as_parent(server, variant):
    assert variant["id"].startswith("var_") and variant["base"] == MODEL
    assert variant["scoring"] == "unsteered" and variant["fits"] is True
    cards = {card["id"]: card for card in api(server, "GET", "/v1/models").json()["data"]}
    card = cards["pirate"]
    assert card["parent"] == MODEL and card["object"] == "model"
    assert card["owned_by"] == cards[MODEL]["owned_by"]
    assert card["max_model_len"] == cards[MODEL]["max_model_len"]
    assert card["millm"]["variant"] == variant["id"]
    assert card["millm"]["steering"] == spec(
        api(server, "GET", "/api/saes").json()["data"][0]["id"]
    )
    assert "parent" not in cards[MODEL] and "millm" not in cards[MODEL]
    assert api(server, "GET", "/v1/models/pirate").json() == card


def test_a_variant_generates_what_its_base_does_with_the_same_steering(server, variant, sae_id):
    through_variant = chat(server, "pirate")
    through_base = chat(server, MODEL, steering=spec(sae_id))
    unsteered = chat(server, MODEL)
    assert through_variant["model"] == "pirate"
    assert through_variant["choices"][0]["message"] == through_base["choices"][0]["message"]
    assert through_variant["choices"][0]["message"] != unsteered["choices"][0]["message"]
    kind, params = member(through_variant["steering"])
    assert kind == "inline" and params["variant"] == "pirate"
    off = chat(server, "pirate", steering_intensity="off")
    assert off["choices"][0]["message"] == unsteered["choices"][0]["message"]


def test_a_variant_streams_and_answers_the_responses_api_under_its_name(server, variant):
    response = post(
        server,
        "/v1/chat/completions",
        {"model": "pirate", "messages": USER, "max_tokens": 4, "stream": True},
    )
    assert response.status_code == 200, response.text
    assert '"model":"pirate"' in response.text.replace(" ", "")
    answered = post(
        server, "/v1/responses", {"model": "pirate", "input": "Hi", "max_output_tokens": 4}
    )
    assert answered.status_code == 200, answered.text
    assert answered.json()["model"] == "pirate"


def test_scoring_a_variant_is_unsteered_unless_it_says_steered(
    server, variant, sae_id, tiny_dirs, sae_dir
):
    base = echo_logprobs(server, MODEL)
    assert echo_logprobs(server, "pirate") == base  # scoring: unsteered by default
    changed = api(server, "PATCH", "/api/variants/pirate", json={"scoring": "steered"})
    assert changed.status_code == 200 and changed.json()["scoring"] == "steered"
    steered = echo_logprobs(server, "pirate")
    ids = api(server, "POST", "/tokenize", json={"model": "pirate", "prompt": PROMPT}).json()[
        "tokens"
    ]
    expected = steered_logprobs(tiny_dirs["llama"], sae_dir, ids, LAYER, INDEX, STRENGTH)
    assert steered == pytest.approx(
        [expected[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=1e-4
    )
    assert max(abs(a - b) for a, b in zip(steered, base, strict=True)) > 1e-3
    body = {"model": "pirate", "prompt": PROMPT, "max_tokens": 1, "logprobs": 1}
    response = post(server, "/v1/completions", body)
    kind, params = member(response.headers["x-millm-steering"])
    assert kind == "inline" and params["variant"] == "pirate" and params["features"] == 1
    assert response.json()["choices"][0]["logprobs"]["token_logprobs"][0] == pytest.approx(
        expected[-1].max().item(), abs=1e-4
    )


def test_a_variant_is_tokenized_and_embedded_as_its_base(server, variant):
    for path, body in (
        ("/tokenize", {"prompt": PROMPT}),
        ("/v1/embeddings", {"input": PROMPT}),
    ):
        ours = post(server, path, {"model": "pirate", **body}).json()
        theirs = post(server, path, {"model": MODEL, **body}).json()
        ours.pop("model", None), theirs.pop("model", None)
        assert ours == theirs, path


def test_a_request_naming_a_variant_cannot_send_its_own_steering(server, variant, sae_id):
    for field, value in (("profile", "anything"), ("steering", spec(sae_id))):
        body = {"model": "pirate", "messages": USER, "max_tokens": 2, field: value}
        assert error(post(server, "/v1/chat/completions", body), 400)["param"] == field


def test_a_variant_whose_steering_no_longer_fits_is_refused_by_name(server, variant, sae_id):
    assert api(server, "POST", f"/api/saes/{sae_id}/detach").status_code == 200
    try:
        body = {"model": "pirate", "messages": USER, "max_tokens": 2}
        refused = error(post(server, "/v1/chat/completions", body), 400, "variant_unfit")
        assert refused["param"] == "model" and "'pirate'" in refused["message"]
        view = api(server, "GET", "/api/variants/pirate").json()
        assert view["fits"] is False and view["problem"]
    finally:
        assert api(server, "POST", f"/api/saes/{sae_id}/attach").status_code == 200
    assert chat(server, "pirate")["model"] == "pirate"


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        ({"base": "no-such-model"}, "base", "unknown_base"),
        ({"name": MODEL}, "name", "variant_name_taken"),
        ({"profile": "no-such-profile"}, "profile", "profile_not_found"),
        ({"steering_intensity": 3}, "steering_intensity", None),
        ({"steering_intensity": "loud"}, "steering_intensity", None),
        ({"scoring": "sometimes"}, "scoring", None),
        ({"name": "bad/name"}, "name", None),
        ({"unknown": 1}, "unknown", None),
    ],
)
def test_bad_variants_are_refused_naming_the_field(server, sae_id, change, param, code):
    body = {"name": "bad", "base": MODEL, "steering": spec(sae_id), **change}
    if "profile" in change:
        body.pop("steering")
    refused = error(api(server, "POST", "/api/variants", json=body), 400, code)
    assert refused["param"] == param
    assert api(server, "GET", "/api/variants/bad").status_code == 404


def test_steering_that_does_not_parse_or_fit_is_refused(server, sae_id):
    both = {"name": "bad", "base": MODEL, "steering": spec(sae_id), "profile": "p"}
    assert error(api(server, "POST", "/api/variants", json=both), 400)["param"] == "steering"
    neither = {"name": "bad", "base": MODEL}
    assert error(api(server, "POST", "/api/variants", json=neither), 400)["param"] == "profile"
    past_width = {"name": "bad", "base": MODEL, "steering": spec(sae_id, index=10_000)}
    assert (
        error(api(server, "POST", "/api/variants", json=past_width), 400, "variant_unfit")["param"]
        == "steering"
    )
    malformed = {"name": "bad", "base": MODEL, "steering": {"steering": [{"layer": 1}]}}
    assert error(api(server, "POST", "/api/variants", json=malformed), 400)["param"].startswith(
        "steering"
    )


def test_names_are_one_namespace_and_variants_are_not_bases(server, variant, tiny_dirs):
    again = {"name": "pirate", "base": MODEL, "profile": "x"}
    api(server, "POST", "/api/profiles", json={"name": "x", "steering": []})
    try:
        error(api(server, "POST", "/api/variants", json=again), 409, "variant_exists")
        on_variant = {"name": "deeper", "base": "pirate", "profile": "x"}
        assert (
            error(api(server, "POST", "/api/variants", json=on_variant), 400, "unknown_base")[
                "param"
            ]
            == "base"
        )
        registered = api(
            server,
            "POST",
            "/api/models",
            json={"source": str(tiny_dirs["llama"]), "name": "pirate"},
        )
        error(registered, 409, "model_exists")
    finally:
        api(server, "DELETE", "/api/profiles/x")


def test_a_profile_variant_follows_its_profile_and_is_refused_once_it_is_gone(server, sae_id):
    profile = {"name": "for-variant", "steering": spec(sae_id)["steering"]}
    assert api(server, "POST", "/api/profiles", json=profile).status_code == 201
    body = {
        "name": "by-profile",
        "base": MODEL,
        "profile": "for-variant",
        "steering_intensity": 0.5,
    }
    assert api(server, "POST", "/api/variants", json=body).status_code == 201
    try:
        half = chat(server, MODEL, steering=spec(sae_id, STRENGTH / 2))
        through = chat(server, "by-profile")
        assert through["choices"][0]["message"] == half["choices"][0]["message"]
        assert 'variant="by-profile"' in through["steering"]
        api(server, "DELETE", "/api/profiles/for-variant")
        refused = post(server, "/v1/chat/completions", {"model": "by-profile", "messages": USER})
        assert error(refused, 400, "variant_unfit")["param"] == "model"
    finally:
        api(server, "DELETE", "/api/variants/by-profile")
        api(server, "DELETE", "/api/profiles/for-variant")


def test_patch_renames_and_replaces_the_steering_and_delete_forgets(server, variant, sae_id):
    renamed = api(
        server,
        "PATCH",
        "/api/variants/pirate",
        json={"name": "pirate-2", "steering": spec(sae_id, 10.0), "description": "milder"},
    )
    assert renamed.status_code == 200, renamed.text
    view = renamed.json()
    assert view["name"] == "pirate-2" and view["description"] == "milder"
    assert view["steering"] == spec(sae_id, 10.0)
    assert chat(server, "pirate-2")["model"] == "pirate-2"
    error(post(server, "/v1/chat/completions", {"model": "pirate", "messages": USER}), 404)
    gone = api(server, "DELETE", "/api/variants/pirate-2")
    assert gone.json() == {
        "id": variant["id"],
        "name": "pirate-2",
        "object": "variant",
        "deleted": True,
    }
    assert "pirate-2" not in [c["id"] for c in api(server, "GET", "/v1/models").json()["data"]]
    error(post(server, "/v1/chat/completions", {"model": "pirate-2", "messages": USER}), 404)


def test_variants_are_kept_across_a_restart(tiny_dirs, tmp_path, sae_id, server):
    # Its own home, so the module's server keeps running.
    process = ServerProcess(tmp_path, ["--model", str(tiny_dirs["llama"])])
    try:
        process.wait_ready()
        body = {"name": "kept", "base": MODEL, "steering": {"steering": []}, "scoring": "steered"}
        assert api(process, "POST", "/api/variants", json=body).status_code == 201
    finally:
        process.stop()
    again = ServerProcess(tmp_path, ["--model", str(tiny_dirs["llama"])])
    try:
        again.wait_ready()
        view = api(again, "GET", "/api/variants/kept").json()
        assert view["scoring"] == "steered" and view["steering"] == {"steering": []}
        assert "kept" in [c["id"] for c in api(again, "GET", "/v1/models").json()["data"]]
    finally:
        again.stop()


def test_a_variant_shares_the_prefix_cache_under_its_own_steering(server, variant):
    long = [{"role": "user", "content": "Every feature counts quickly. " * 6 + "Tell me more."}]
    first = chat(server, "pirate", messages=long)
    again = chat(server, "pirate", messages=long)
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    # The base model's unsteered pass computes other keys and values: it never reuses the variant's.
    base = chat(server, MODEL, messages=long)
    assert base["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def unit_vector(name: str) -> dict:
    """A millm.steering-vector file for the tiny Llama's block LAYER (a unit direction)."""
    values = [0.0] * 64
    values[3] = 1.0
    return {
        "kind": "millm.steering-vector",
        "version": 1,
        "name": name,
        "model": MODEL,
        "layer": LAYER,
        "hook_point": "resid_post",
        "normalisation": "unit",
        "norm": 1.0,
        "d_model": 64,
        "method": "mean",
        "pairs": 1,
        "values": values,
    }


@pytest.fixture
def another_sae(server, tmp_path):
    """A second SAE on block LAYER, registered (not attached)."""
    from tests.support.tiny_saes import build_saelens

    path = build_saelens(tmp_path / "other", layer=LAYER, seed=77)
    return post(server, "/api/saes", {"path": str(path)}).json()["id"]


CASES = {
    "profile, its SAE detached": ("profile", {}),
    "profile dialled off, its SAE detached": ("profile", {"steering_intensity": "off"}),
    "profile, scoring steered, its SAE detached": ("profile", {"scoring": "steered"}),
    "steering, another SAE attached in its place": ("replaced", {"scoring": "steered"}),
    "steering vector, the vector deleted": ("vector", {}),
}


@pytest.mark.parametrize("case", CASES)
def test_every_way_a_variant_stops_fitting_is_refused_never_answered_unsteered(
    server, sae_id, another_sae, case
):
    how, extra = CASES[case]
    body = {"name": "fragile", "base": MODEL, **extra}
    if how == "profile":
        profile = {"name": "fragile-profile", "steering": spec(sae_id)["steering"]}
        assert api(server, "POST", "/api/profiles", json=profile).status_code == 201
        body["profile"] = "fragile-profile"
    elif how == "vector":
        assert post(server, "/api/vectors/import", unit_vector("fragile-vector")).status_code == 201
        body["steering"] = {"vectors": [{"vector_id": "fragile-vector", "strength": 5.0}]}
    else:
        body["steering"] = spec(sae_id)
    created = api(server, "POST", "/api/variants", json=body)
    assert created.status_code == 201, created.text
    try:
        assert created.json()["fits"] is True
        if how == "vector":
            assert api(server, "DELETE", "/api/vectors/fragile-vector").status_code == 200
        else:
            assert api(server, "POST", f"/api/saes/{sae_id}/detach").status_code == 200
        if how == "replaced":
            assert api(server, "POST", f"/api/saes/{another_sae}/attach").status_code == 200
        view = api(server, "GET", "/api/variants/fragile").json()
        assert view["fits"] is False and view["problem"], view
        refused = error(
            post(server, "/v1/chat/completions", {"model": "fragile", "messages": USER}),
            400,
            "variant_unfit",
        )
        assert refused["param"] == "model" and "'fragile'" in refused["message"]
        scored = {
            "model": "fragile",
            "prompt": PROMPT,
            "echo": True,
            "logprobs": 1,
            "max_tokens": 0,
        }
        scoring = post(server, "/v1/completions", scored)
        if body.get("scoring") == "steered":
            assert error(scoring, 400, "variant_unfit")["param"] == "model"
        else:  # its scoring is the base model's, as the variant promises
            assert scoring.status_code == 200
    finally:
        api(server, "DELETE", "/api/variants/fragile")
        api(server, "DELETE", "/api/profiles/fragile-profile")
        api(server, "DELETE", "/api/vectors/fragile-vector")
        api(server, "POST", f"/api/saes/{another_sae}/detach")
        if not api(server, "GET", f"/api/saes/{sae_id}").json()["attached"]:
            assert api(server, "POST", f"/api/saes/{sae_id}/attach").status_code == 200
