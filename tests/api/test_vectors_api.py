"""/api/vectors on a live server (tiny Llama): a trained vector equals the difference of means (or
the uncentred principal direction) of residuals captured offline by a hook on a stock transformers
model, each text pooled over every position but the first; explaining it through an SAE built so
that one feature's decoder row is that separating direction ranks that feature first with cosine 1
and a fraction explained equal to a least-squares projection; export -> import is bit for bit; bad
files and requests are refused naming the field; vectors survive a restart."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch

from millm.engine.prompts import chat_prompt_ids
from millm.interp.formats import read_sae
from tests.api.clients import MODEL, api, error, post
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens, sae_tensors

LAYER = 1
BUILT = 17  # the feature whose decoder row is the direction separating the pairs
MAX_TEXTS, MAX_TOKENS = 6, 300  # the server's discovery caps (pairs per training, tokens in all)
PAIRS = [
    ("The cat runs café quickly.", "The cat runs quickly."),
    ("My friend reads the café.", "My friend reads the city."),
    ("A river is a café.", "A river is a model."),
    ("Every feature counts café twice.", "Every feature counts twice."),
]
CHAT = (
    [{"role": "user", "content": "Tell me about the café."}],
    [{"role": "user", "content": "Tell me about the river."}],
)


@pytest.fixture(scope="module")
def offline(tiny_dirs):
    """The stock model and tokenizer, with a hook keeping the residual after block LAYER;
    `pooled(ids)` is a text's mean residual over every position but the first (float64)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    kept = {}

    def hook(module, args, output):
        kept["residual"] = (output[0] if isinstance(output, tuple) else output)[0].clone()

    model.model.layers[LAYER].register_forward_hook(hook)

    def pooled(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            model(torch.tensor([ids]))
        return kept["residual"][1:].double().mean(0).numpy()

    return tokenizer, pooled


@pytest.fixture(scope="module")
def separation(offline):
    """The text pairs' pooled differences `[n, 64]`, measured offline."""
    tokenizer, pooled = offline
    return np.stack(
        [pooled(tokenizer(p)["input_ids"]) - pooled(tokenizer(n)["input_ids"]) for p, n in PAIRS]
    )


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory, separation):
    """A random SAE whose feature BUILT's decoder row is the pairs' mean difference (unit), at
    resid_post of LAYER; its decoder read at resid_pre of LAYER + 1 (the same residual); and one
    at resid_post of LAYER + 1."""
    tensors = sae_tensors(64, 128, seed=21)
    direction = separation.mean(0) / np.linalg.norm(separation.mean(0))
    tensors["W_dec"][BUILT] = torch.from_numpy(direction).float()
    base = tmp_path_factory.mktemp("vector-saes")
    return {
        "here": build_saelens(base / "here", layer=LAYER, architecture="standard", tensors=tensors),
        "pre_next": build_saelens(
            base / "pre-next",
            layer=LAYER + 1,
            hook_point="resid_pre",
            architecture="standard",
            tensors={**tensors, "b_enc": tensors["b_enc"] + 1.0},
        ),  # another file: another SAE id
        "elsewhere": build_saelens(base / "elsewhere", layer=LAYER + 1, seed=4),
    }


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dirs):
    env = {
        "MILLM_DISCOVERY_MAX_TEXTS": str(MAX_TEXTS),
        "MILLM_DISCOVERY_MAX_TOKENS": str(MAX_TOKENS),
    }
    process = ServerProcess(
        tmp_path_factory.mktemp("vectors-home"), ["--model", str(tiny_dirs["llama"])], env=env
    )
    try:
        process.wait_ready()
        process.saes = {
            name: post(process, "/api/saes", {"path": str(path)}).json()["id"]
            for name, path in sae_dirs.items()
        }
        assert post(process, f"/api/saes/{process.saes['here']}/attach", {}).status_code == 200
        yield process
    finally:
        process.stop()


def finished(server, job: dict, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while job["state"] == "running":
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
        job = api(server, "GET", f"/api/jobs/{job['id']}").json()
    return job


def trained(server, body: dict) -> dict:
    started = post(server, "/api/vectors/train", body)
    assert started.status_code == 202, started.text
    job = finished(server, started.json())
    assert job["state"] == "succeeded" and job["kind"] == "vector", job
    return job["result"]


def pair_body(name: str, **extra) -> dict:
    return {
        "name": name,
        "layer": LAYER,
        "pairs": [{"positive": p, "negative": n} for p, n in PAIRS],
        **extra,
    }


def exported(server, key: str) -> dict:
    response = api(server, "GET", f"/api/vectors/{key}/export")
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def mean_vector(server):
    return trained(server, pair_body("cafe", description="café against not"))


# training -----------------------------------------------------------------------------------------
def test_training_stores_the_difference_of_means_of_pooled_residuals(
    server, mean_vector, separation
):
    expected = separation.mean(0)
    vector = mean_vector
    assert (
        vector["id"].startswith("vec_")
        and vector["object"] == "vector"
        and vector["name"] == "cafe"
    )
    assert (vector["model"], vector["d_model"], vector["layer"], vector["hook_point"]) == (
        MODEL,
        64,
        LAYER,
        "resid_post",
    )
    assert (vector["method"], vector["pairs"], vector["description"]) == (
        "mean",
        4,
        "café against not",
    )
    assert vector["norm"] == pytest.approx(float(np.linalg.norm(expected)), rel=1e-4)
    assert vector["agreement"] == pytest.approx(float(np.mean(separation @ expected > 0)))
    document = exported(server, vector["id"])
    values = np.asarray(document["values"])
    np.testing.assert_allclose(values, expected / np.linalg.norm(expected), atol=1e-5)
    np.testing.assert_allclose(vector["norm"] * values, expected, atol=1e-4 * vector["norm"])
    assert (
        api(server, "GET", f"/api/vectors/{vector['id']}").json()
        == vector
        == api(server, "GET", "/api/vectors/cafe").json()
    )
    assert vector in api(server, "GET", "/api/vectors").json()["data"]


def test_pca_is_the_uncentred_principal_direction_of_the_pairs_differences(
    server, offline, separation
):
    tokenizer, pooled = offline
    chat = pooled(chat_prompt_ids(tokenizer, CHAT[0])) - pooled(chat_prompt_ids(tokenizer, CHAT[1]))
    diffs = np.vstack([separation, chat])
    body = pair_body("cafe-pca", method="pca")
    body["pairs"].append({"positive": CHAT[0], "negative": CHAT[1]})
    vector = trained(server, body)
    _, vectors = np.linalg.eigh(diffs.T @ diffs)
    top = vectors[:, -1] * np.sign(vectors[:, -1] @ diffs.mean(0))
    values = np.asarray(exported(server, vector["id"])["values"])
    assert values.shape == (64,) and (vector["method"], vector["pairs"]) == ("pca", 5)
    np.testing.assert_allclose(values, top, atol=1e-4)
    assert (
        vector["norm"] == pytest.approx(float(diffs.mean(0) @ top), rel=1e-4) and vector["norm"] > 0
    )


# explaining ---------------------------------------------------------------------------------------
def projection_fraction(vector: np.ndarray, rows: np.ndarray) -> float:
    coefficients, *_ = np.linalg.lstsq(rows.T, vector, rcond=None)
    projection = rows.T @ coefficients
    return float(projection @ projection / (vector @ vector))


def test_explain_ranks_first_the_feature_built_on_the_separating_direction(
    server, mean_vector, sae_dirs
):
    got = api(server, "GET", f"/api/vectors/{mean_vector['id']}/explain", params={"k": 4})
    assert got.status_code == 200, got.text
    explained = got.json()
    assert (
        explained["object"] == "vector.explanation"
        and explained["sae_id"] == server.saes["here"]
        and explained["k"] == 4
    )
    first = explained["features"][0]
    assert first["index"] == BUILT and first["cosine"] == pytest.approx(1.0, abs=1e-5)
    assert first["label"] == f"feature {BUILT} river" and first["cumulative"] == pytest.approx(
        1.0, abs=1e-5
    )
    values = np.asarray(exported(server, mean_vector["id"])["values"])
    decoder = read_sae(sae_dirs["here"])[1].W_dec.detach().double().numpy()
    unit_rows = decoder / np.linalg.norm(decoder, axis=1, keepdims=True)
    cosines = unit_rows @ values
    assert [f["index"] for f in explained["features"]] == sorted(
        range(128), key=lambda i: -abs(cosines[i])
    )[:4]
    for feature in explained["features"]:
        assert feature["cosine"] == pytest.approx(float(cosines[feature["index"]]), abs=1e-5)

    # A vector the SAE only partly explains: the pairs' PCA direction, over the first three
    # features.
    pca = exported(server, "cafe-pca")
    part = api(
        server,
        "GET",
        "/api/vectors/cafe-pca/explain",
        params={"k": 3, "sae_id": server.saes["here"]},
    ).json()
    shown = [f["index"] for f in part["features"]]
    expected = projection_fraction(np.asarray(pca["values"]), unit_rows[shown])
    assert 0.5 < expected < 0.9999  # a fraction, not a foregone 1
    assert part["fraction_explained"] == pytest.approx(expected, abs=1e-5)
    assert [f["cumulative"] for f in part["features"]] == pytest.approx(
        [
            projection_fraction(np.asarray(pca["values"]), unit_rows[shown[: j + 1]])
            for j in range(3)
        ],
        abs=1e-5,
    )


def test_an_sae_reading_the_same_residual_explains_and_one_elsewhere_is_refused(
    server, mean_vector
):
    same = api(
        server,
        "GET",
        f"/api/vectors/{mean_vector['id']}/explain",
        params={"k": 1, "sae_id": server.saes["pre_next"]},
    )
    assert same.status_code == 200, same.text  # resid_pre of layer 2 is resid_post of layer 1
    assert (
        same.json()["features"][0]["index"] == BUILT
        and same.json()["hook_point"] == "resid_pre"
        and same.json()["layer"] == LAYER + 1
    )
    refused = error(
        api(
            server,
            "GET",
            f"/api/vectors/{mean_vector['id']}/explain",
            params={"sae_id": server.saes["elsewhere"]},
        ),
        400,
        "vector_sae_mismatch",
    )
    assert (
        refused["param"] == "sae_id"
        and "layer 2" in refused["message"]
        and "layer 1" in refused["message"]
    )
    assert (
        error(
            api(server, "GET", "/api/vectors/cafe/explain", params={"sae_id": "sae_000000000000"}),
            404,
            "sae_not_found",
        )["param"]
        == "sae_id"
    )
    error(
        api(server, "GET", "/api/vectors/cafe/explain", params={"k": 0}), 400, "invalid_parameter"
    )


# files --------------------------------------------------------------------------------------------
def test_export_then_import_is_bit_for_bit(server, mean_vector):
    response = api(server, "GET", f"/api/vectors/{mean_vector['id']}/export")
    assert response.headers["content-disposition"] == 'attachment; filename="cafe.json"'
    document = response.json()
    assert (
        document["kind"] == "millm.steering-vector"
        and document["version"] == 1
        and document["normalisation"] == "unit"
    )
    assert (
        error(post(server, "/api/vectors/import", document), 409, "vector_exists")["param"]
        == "name"
    )
    imported = post(server, "/api/vectors/import?on_conflict=rename", document)
    assert imported.status_code == 201, imported.text
    copy = imported.json()
    assert (
        copy["name"] == "cafe-2" and copy["id"] != mean_vector["id"] and copy["agreement"] is None
    )
    again = exported(server, copy["id"])
    assert {**again, "name": "cafe"} == document
    assert (
        np.asarray(again["values"], dtype=np.float32).tobytes()
        == np.asarray(document["values"], dtype=np.float32).tobytes()
    )
    deleted = api(server, "DELETE", f"/api/vectors/{copy['id']}")
    assert deleted.json() == {
        "id": copy["id"],
        "object": "vector.deleted",
        "name": "cafe-2",
        "deleted": True,
    }
    assert (
        error(api(server, "GET", f"/api/vectors/{copy['id']}"), 404, "vector_not_found")["param"]
        == "vector_id"
    )


@pytest.mark.parametrize(
    "change, param",
    [
        ({"values": "drop-one"}, "values"),
        ({"colour": "red"}, "colour"),
        ({"norm": -1.0}, "norm"),
        ({"method": "ica"}, "method"),
        ({"values": "scale"}, "values"),
    ],
)
def test_a_bad_file_is_refused_naming_the_field(server, mean_vector, change, param):
    document = exported(server, mean_vector["id"])
    if change.get("values") == "drop-one":
        change = {"values": document["values"][:-1]}
    elif change.get("values") == "scale":
        change = {"values": [2 * v for v in document["values"]]}
    body = error(
        post(server, "/api/vectors/import", {**document, **change, "name": "bad"}),
        400,
        type_="invalid_request_error",
    )
    assert body["param"] == param, body


def test_nan_and_infinity_in_a_file_are_refused(server, mean_vector):
    document = exported(server, mean_vector["id"])
    text = json.dumps({**document, "name": "bad"})
    for spelled, param in (("NaN", "values[3]"), ("Infinity", "values[3]")):
        values = list(document["values"])
        raw = text.replace(
            json.dumps(values),
            json.dumps(values[:3])[:-1] + f", {spelled}, " + json.dumps(values[4:])[1:],
        )
        response = api(
            server,
            "POST",
            "/api/vectors/import",
            content=raw.encode(),
            headers={"content-type": "application/json"},
        )
        assert error(response, 400)["param"] == param, response.text
    assert "bad" not in [v["name"] for v in api(server, "GET", "/api/vectors").json()["data"]]


# refusals before training -------------------------------------------------------------------------
LONG = " ".join(["The cat runs café quickly."] * 60)  # past MILLM_DISCOVERY_MAX_TOKENS alone
LONGER = " ".join(["The cat runs café quickly."] * 320)  # past the context window (2048)


@pytest.mark.parametrize(
    "change, status, param, code",
    [
        (
            {"pairs": [{"positive": "café is here.", "negative": "it is here."}] * (MAX_TEXTS + 1)},
            400,
            "pairs",
            "invalid_parameter",
        ),
        (
            {
                "pairs": [
                    {"positive": "The cat runs café quickly.", "negative": "The cat runs quickly."}
                ],
                "method": "pca",
            },
            400,
            "pairs",
            "invalid_parameter",
        ),
        ({"layer": 3}, 400, "layer", "invalid_parameter"),
        ({"hook_point": "attn_out"}, 400, "hook_point", "invalid_parameter"),
        ({"name": "cafe"}, 409, "name", "vector_exists"),
        (
            {"pairs": [{"positive": "The cat runs quickly.", "negative": LONG}]},
            400,
            "pairs[0].negative",
            "invalid_parameter",
        ),
        (
            {"pairs": [{"positive": LONGER, "negative": "The cat."}]},
            400,
            "pairs[0].positive",
            "context_length_exceeded",
        ),
        (
            {
                "pairs": [
                    {"positive": [{"role": "wizard", "content": "hi"}], "negative": "The cat."}
                ]
            },
            400,
            "pairs[0].positive",
            "invalid_parameter",
        ),
        ({"model": "another-model"}, 400, "model", "invalid_parameter"),
    ],
)
def test_a_training_request_is_refused_before_any_pass(
    server, mean_vector, change, status, param, code
):
    response = post(server, "/api/vectors/train", {**pair_body("refused"), **change})
    assert error(response, status, code)["param"] == param, response.text
    assert "refused" not in [v["name"] for v in api(server, "GET", "/api/vectors").json()["data"]]


# restarts -----------------------------------------------------------------------------------------
def test_vectors_survive_a_restart(tiny_dirs, tmp_path_factory, server, mean_vector):
    document = exported(server, mean_vector["id"])
    home = tmp_path_factory.mktemp("vectors-restart")
    first = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    try:
        first.wait_ready()
        stored = post(first, "/api/vectors/import", document).json()
        again = trained(first, {**pair_body("kept"), "pairs": pair_body("kept")["pairs"][:2]})
    finally:
        first.stop()
    second = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
    try:
        second.wait_ready()
        listed = api(second, "GET", "/api/vectors").json()["data"]
        assert listed == [stored, again]
        assert exported(second, stored["id"]) == document
        assert exported(second, "kept")["norm"] == again["norm"]
    finally:
        second.stop()


# plans --------------------------------------------------------------------------------------------
def test_a_vector_in_a_request_steers_like_the_feature_built_on_it(server, mean_vector):
    """The vector's unit direction is feature BUILT's decoder row (to float32 rounding): adding
    either at strength 20 at layer 1 reads the same activations after the edit, and the answers
    are the same tokens."""
    read = {
        "sae_id": server.saes["here"],
        "features": [BUILT, 3, 40],
        "top_k": 3,
        "positions": "all",
    }
    body = {
        "model": MODEL,
        "prompt": "The cat runs quickly.",
        "max_tokens": 6,
        "temperature": 0,
        "return_sae_activations": read,
    }
    by_vector = post(
        server,
        "/v1/completions",
        {**body, "steering": {"vectors": [{"vector_id": mean_vector["id"], "strength": 20.0}]}},
    )
    by_feature = post(
        server,
        "/v1/completions",
        {
            **body,
            "steering": {
                "steering": [
                    {
                        "sae_id": server.saes["here"],
                        "features": [{"index": BUILT, "strength": 20.0}],
                    }
                ]
            },
        },
    )
    plain = post(server, "/v1/completions", body)
    assert by_vector.status_code == 200 and by_feature.status_code == 200, (
        by_vector.text,
        by_feature.text,
    )

    def values(answer) -> list[tuple[int, int, float]]:
        return [
            (p["token_id"], f["index"], f["value"])
            for p in answer.json()["millm"]["sae_activations"]["positions"]
            for f in p["features"]
        ]

    steered, reference, unsteered = values(by_vector), values(by_feature), values(plain)
    assert [(t, i) for t, i, _ in steered] == [(t, i) for t, i, _ in reference]
    assert [v for *_, v in steered] == pytest.approx([v for *_, v in reference], abs=1e-3)
    # and it did steer
    assert max(abs(a[2] - b[2]) for a, b in zip(steered, unsteered, strict=False)) > 1.0
    kind, params = member(by_vector.headers["x-millm-steering"])
    assert kind == "inline" and params["vector"].startswith("vec_") and params["features"] == 1


def test_a_vector_of_another_model_or_unknown_is_refused_in_a_request(server, mean_vector):
    body = {"model": MODEL, "prompt": "The cat", "max_tokens": 2}
    unknown = error(
        post(
            server,
            "/v1/completions",
            {**body, "steering": {"vectors": [{"vector_id": "vec_000000000000", "strength": 5.0}]}},
        ),
        400,
        "vector_not_found",
    )
    assert "vectors[0]" in unknown["message"]
    document = exported(server, mean_vector["id"])
    foreign = post(
        server, "/api/vectors/import", {**document, "name": "foreign", "model": "another-model"}
    )
    assert foreign.status_code == 201, foreign.text
    refused = error(
        post(
            server,
            "/v1/completions",
            {
                **body,
                "steering": {"vectors": [{"vector_id": foreign.json()["id"], "strength": 5.0}]},
            },
        ),
        400,
        "vector_not_applicable",
    )
    assert "another-model" in refused["message"]
    api(server, "DELETE", f"/api/vectors/{foreign.json()['id']}")
