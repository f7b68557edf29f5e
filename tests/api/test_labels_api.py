"""Feature labels, ranked label search and feature details on a live server (tiny Llama, two tiny
SAEs: one attached, one only registered): every import format, merge and replace, exports that
read back, refusals, ranking, FTS syntax in queries, neighbours equal to cosines computed here,
and labels that survive a restart."""

from __future__ import annotations

import json

import pytest
import torch

from millm.interp.formats import read_sae
from tests.api.clients import api, error
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

WIDTH = 128
# below MAX_REQUEST_BYTES (4 MiB): a 413 document_too_large shows labels are counted as imports
IMPORT_CAP = 200_000


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("label-saes")
    return {
        "attached": build_saelens(base / "attached", layer=1, seed=61),
        "registered": build_saelens(base / "registered", layer=2, seed=62),
    }


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dirs):
    env = {"MAX_IMPORT_BYTES": str(IMPORT_CAP)}
    process = ServerProcess(
        tmp_path_factory.mktemp("labels-home"), ["--model", str(tiny_dirs["llama"])], env=env
    )
    try:
        process.wait_ready()
        process.ids = {
            name: api(process, "POST", "/api/saes", json={"path": str(path)}).json()["id"]
            for name, path in sae_dirs.items()
        }
        assert (
            api(process, "POST", f"/api/saes/{process.ids['attached']}/attach").status_code == 200
        )
        process.env = env
        yield process
    finally:
        process.stop()


def labels_of(server, sae: str) -> dict[str, str]:
    response = api(server, "GET", f"/api/saes/{sae}/labels")
    assert response.status_code == 200, response.text
    return response.json()


def put(server, sae: str, body, method: str = "PUT", **kwargs) -> dict:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = kwargs.pop("headers", {"content-type": "application/json"})
    response = api(
        server, method, f"/api/saes/{sae}/labels", content=content, headers=headers, **kwargs
    )
    assert response.status_code == 200, response.text
    return response.json()


def search(server, sae: str, q: str, **params) -> dict:
    response = api(server, "GET", f"/api/saes/{sae}/features", params={"q": q, **params})
    assert response.status_code == 200, response.text
    return response.json()


def test_an_sae_files_own_labels_are_there_at_once(server):
    sae = server.ids["registered"]
    assert len(labels_of(server, sae)) == WIDTH
    found = search(server, sae, "paris", limit=3)
    assert (found["labels"], found["has_labels"], found["query"]) == (WIDTH, True, "paris")
    assert [(f["index"], f["label"], f["source"]) for f in found["data"]] == [
        (0, "feature 0 paris", "sae_file"),
        (10, "feature 10 paris", "sae_file"),
        (20, "feature 20 paris", "sae_file"),
    ]
    assert all(f["score"] > 0 for f in found["data"])


NEURONPEDIA = [
    {
        "modelId": "tiny-llama",
        "layer": "1-res",
        "index": "5",
        "description": " pirate speech",
        "explanationModelName": "gpt-4o-mini",
        "typeName": "oai",
    },
    {
        "modelId": "tiny-llama",
        "layer": "1-res",
        "index": "5",
        "description": "nautical words",
        "explanationModelName": "claude",
    },
    {"modelId": "tiny-llama", "layer": "1-res", "index": "9", "description": ""},
    {"modelId": "tiny-llama", "layer": "1-res", "index": "17", "description": "French cities"},
]


@pytest.mark.parametrize(
    "body, headers, params, fmt, expected",
    [
        (NEURONPEDIA, None, {}, "neuronpedia", {"5": "pirate speech", "17": "French cities"}),
        (
            {
                "index": 3,
                "explanations": [{"description": " the word sea", "explanationModelName": "m"}],
            },
            None,
            {},
            "neuronpedia_feature",
            {"3": "the word sea"},
        ),
        (
            [
                {"index": "3", "explanations": [{"description": "sea"}]},
                {"index": 4, "explanations": [{"description": "sky"}]},
            ],
            None,
            {},
            "neuronpedia_feature",
            {"3": "sea", "4": "sky"},
        ),
        (
            {
                "explanations": [
                    {
                        "feature_index": 8,
                        "explanations": [
                            {"description": "love", "method": "miStudio_openai", "score": 0.9}
                        ],
                    }
                ]
            },
            None,
            {},
            "mistudio",
            {"8": "love"},
        ),
        (
            {"1": "one", "2": {"label": "two", "top_tokens": [" two"]}},
            None,
            {},
            "json",
            {"1": "one", "2": "two"},
        ),
        (
            b'index,label\n6,six\n7,"seven, eight"\n',
            {"content-type": "text/csv"},
            {},
            "csv",
            {"6": "six", "7": "seven, eight"},
        ),
        (
            b"6,six\n",
            {"content-type": "application/octet-stream"},
            {"format": "csv"},
            "csv",
            {"6": "six"},
        ),
    ],
)
def test_each_format_is_imported(server, body, headers, params, fmt, expected):
    sae = server.ids["attached"]
    answer = put(
        server, sae, body, headers=headers or {"content-type": "application/json"}, params=params
    )
    assert (answer["format"], answer["imported"], answer["total"]) == (
        fmt,
        len(expected),
        len(expected),
    )
    assert labels_of(server, sae) == expected


def test_the_detail_keeps_what_the_source_said(server):
    sae = server.ids["attached"]
    put(server, sae, NEURONPEDIA)
    detail = api(server, "GET", f"/api/saes/{sae}/features/5").json()
    assert (detail["label"], detail["source"]) == ("pirate speech", "neuronpedia")
    assert detail["detail"] == {
        "model_id": "tiny-llama",
        "neuronpedia_layer": "1-res",
        "explainer": "gpt-4o-mini",
        "type": "oai",
        "others": ["nautical words"],
    }


def test_patch_merges_and_put_replaces(server):
    sae = server.ids["attached"]
    first = put(server, sae, {"1": "one", "2": "two", "3": ""})
    assert (first["imported"], first["skipped"], first["total"], first["source"]) == (
        2,
        1,
        2,
        "plain",
    )
    merged = put(server, sae, {"2": "TWO", "4": "four"}, method="PATCH")
    assert (merged["imported"], merged["replaced"], merged["total"]) == (2, 1, 3)
    assert labels_of(server, sae) == {"1": "one", "2": "TWO", "4": "four"}
    put(server, sae, {"3": ""}, method="PATCH")  # an empty label removes nothing
    assert labels_of(server, sae) == {"1": "one", "2": "TWO", "4": "four"}
    replaced = put(server, sae, {"9": "nine"})
    assert (replaced["replaced"], replaced["total"]) == (3, 1)
    assert labels_of(server, sae) == {"9": "nine"}


@pytest.mark.parametrize("fmt", ["json", "csv", "neuronpedia", "mistudio"])
def test_every_export_reimports_to_the_same_set(server, fmt):
    sae = server.ids["attached"]
    put(server, sae, {"0": "zero", "5": 'a "quoted", comma', "127": "last\nline"})
    exported = api(server, "GET", f"/api/saes/{sae}/labels", params={"format": fmt})
    assert exported.status_code == 200
    assert exported.headers["content-type"].startswith(
        "text/csv" if fmt == "csv" else "application/json"
    )
    assert f"{sae}-labels-{fmt}" in exported.headers["content-disposition"]
    api(server, "DELETE", f"/api/saes/{sae}/labels")
    answer = put(
        server, sae, exported.content, headers={"content-type": exported.headers["content-type"]}
    )
    assert answer["format"] == fmt and answer["total"] == 3
    assert labels_of(server, sae) == {"0": "zero", "5": 'a "quoted", comma', "127": "last\nline"}


def test_the_shipped_labels_export_with_their_detail(server):
    body = api(
        server, "GET", f"/api/saes/{server.ids['registered']}/labels", params={"detail": True}
    ).json()
    assert body["10"] == {"label": "feature 10 paris", "top_tokens": ["tok10"]}
    neuronpedia = api(
        server,
        "GET",
        f"/api/saes/{server.ids['registered']}/labels",
        params={"format": "neuronpedia"},
    ).json()
    assert neuronpedia[10] == {
        "modelId": "tiny-llama",
        "layer": server.ids["registered"],
        "index": "10",
        "description": "feature 10 paris",
        "explanationModelName": None,
        "typeName": None,
    }


def test_bad_documents_are_refused_and_nothing_changes(server):
    sae = server.ids["attached"]
    put(server, sae, {"1": "kept"})

    def refused(body, status, code, headers=None, **kwargs):
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        response = api(
            server,
            "PUT",
            f"/api/saes/{sae}/labels",
            content=content,
            headers=headers or {"content-type": "application/json"},
            **kwargs,
        )
        return error(response, status, code)["message"]

    assert "entry 1: index 'abc' is not a number" in refused(
        [{"index": "2", "description": "x"}, {"index": "abc", "description": "y"}],
        400,
        "invalid_labels",
    )
    assert "entry 'x': index 'x' is not a number" in refused({"x": "y"}, 400, "invalid_labels")
    assert "row 2: index 4 appears twice" in refused(
        b"4,a\n4,b\n", 400, "invalid_labels", headers={"content-type": "text/csv"}
    )
    assert (
        refused({"3": "a", "128": "b"}, 400, "invalid_feature_index")
        == "entry '128': feature 128 is past the SAE's width (128 features: 0..127)"
    )
    assert "not valid JSON" in refused(b"[1,", 400, "invalid_labels")
    assert "is a number" in refused(b"5", 400, "invalid_labels")
    refused({"1": "x"}, 400, "invalid_parameter", params={"format": "yaml"})
    huge = {str(i % WIDTH): "x" * 2000 for i in range(WIDTH)}
    assert "MAX_IMPORT_BYTES" in refused(huge, 413, "document_too_large")
    assert labels_of(server, sae) == {"1": "kept"}
    error(
        api(
            server,
            "PUT",
            "/api/saes/sae_000000000000/labels",
            content=b"{}",
            headers={"content-type": "application/json"},
        ),
        404,
        "sae_not_found",
    )
    error(api(server, "GET", "/api/saes/sae_000000000000/features"), 404, "sae_not_found")


def test_search_ranks_by_relevance(server):
    sae = server.ids["attached"]
    labels = {str(i): f"filler topic {i}" for i in range(WIDTH)}
    labels.update(
        {
            "40": "pirate ship at sea",
            "41": "pirate radio station",
            "42": "radio waves",
            "43": "sea shanty song",
        }
    )
    put(server, sae, labels)
    found = [f["index"] for f in search(server, sae, "pirate ship at sea")["data"]]
    assert found[0] == 40 and set(found) == {40, 41, 43}
    found = [f["index"] for f in search(server, sae, "pirate")["data"]]
    assert found == [40, 41] or found == [
        41,
        40,
    ]  # the word in 2 of the 3 others' labels; the third (42) is not among them
    found = search(server, sae, "pirate radio")["data"]
    assert found[0]["index"] == 41 and {f["index"] for f in found} == {40, 41, 42}
    assert [f["score"] for f in found] == sorted((f["score"] for f in found), reverse=True)
    assert [f["index"] for f in search(server, sae, "PIRATES")["data"]][:2] in (
        [40, 41],
        [41, 40],
    )  # case and plural
    everything = search(server, sae, "", limit=1000)
    assert [f["index"] for f in everything["data"]] == list(range(WIDTH)) and all(
        f["score"] is None for f in everything["data"]
    )
    assert len(search(server, sae, "filler", limit=7)["data"]) == 7


@pytest.mark.parametrize(
    "q",
    [
        '"',
        'pirate"',
        "pirate*",
        "*",
        "NEAR(pirate radio)",
        "pirate AND radio",
        "OR",
        "(",
        "label:pirate",
        "^pirate",
        "-",
        "'; DROP TABLE x; --",
        "é",
        "🏴‍☠️",
    ],
)
def test_fts_syntax_in_the_query_never_errors(server, q):
    search(server, server.ids["attached"], q)


def test_search_bounds(server):
    sae = server.ids["attached"]
    for params in ({"limit": 0}, {"limit": 1001}, {"q": "x" * 1001}):
        error(
            api(server, "GET", f"/api/saes/{sae}/features", params=params), 400, "invalid_parameter"
        )


@pytest.mark.parametrize("which", ["attached", "registered"])
def test_neighbours_match_decoder_cosines(server, sae_dirs, which):
    sae = server.ids[which]
    w_dec = read_sae(sae_dirs[which])[1].W_dec
    labels = labels_of(server, sae)
    for index, k in ((7, 10), (0, 100)):
        detail = api(server, "GET", f"/api/saes/{sae}/features/{index}", params={"k": k}).json()
        cosines = torch.nn.functional.cosine_similarity(
            w_dec, w_dec[index][None, :], dim=-1
        ).double()
        cosines[index] = -2.0
        expected = torch.argsort(cosines, descending=True, stable=True)[:k].tolist()
        assert [n["index"] for n in detail["neighbours"]] == expected
        assert [n["cosine"] for n in detail["neighbours"]] == pytest.approx(
            cosines[expected].tolist(), abs=1e-5
        )
        assert [n["label"] for n in detail["neighbours"]] == [labels.get(str(i)) for i in expected]
        assert detail["decoder_norm"] == pytest.approx(float(w_dec[index].norm()), abs=1e-5)
        assert (detail["sae_id"], detail["index"]) == (sae, index)
    assert len(api(server, "GET", f"/api/saes/{sae}/features/3").json()["neighbours"]) == 10


def test_feature_detail_refusals(server):
    sae = server.ids["registered"]
    assert error(api(server, "GET", f"/api/saes/{sae}/features/128"), 400, "invalid_feature_index")[
        "message"
    ].startswith("feature 128 is past the width")
    error(api(server, "GET", f"/api/saes/{sae}/features/-1"), 400, "invalid_parameter")
    error(api(server, "GET", f"/api/saes/{sae}/features/x"), 400, "invalid_parameter")
    error(
        api(server, "GET", f"/api/saes/{sae}/features/1", params={"k": 101}),
        400,
        "invalid_parameter",
    )
    error(
        api(server, "GET", f"/api/saes/{sae}/features/1", params={"k": 0}), 400, "invalid_parameter"
    )
    error(api(server, "GET", "/api/saes/sae_000000000000/features/1"), 404, "sae_not_found")


def test_an_unlabelled_feature_has_no_label(server):
    sae = server.ids["attached"]
    put(server, sae, {"1": "one"})
    detail = api(server, "GET", f"/api/saes/{sae}/features/2").json()
    assert (detail["label"], detail["source"], detail["detail"]) == (None, None, None)


def test_clearing_and_forgetting(server, sae_dirs):
    sae = server.ids["registered"]
    put(server, sae, {"3": "mine"}, method="PATCH")
    cleared = api(server, "DELETE", f"/api/saes/{sae}/labels").json()
    assert cleared == {"sae_id": sae, "deleted": WIDTH}
    assert labels_of(server, sae) == {} and search(server, sae, "")["has_labels"] is False
    put(server, sae, {"3": "mine"})
    # Forgetting the SAE keeps its labels (the user's data, keyed by the weights' hash); the same
    # file registered again finds them, and its own file's labels are not brought back.
    assert api(server, "DELETE", f"/api/saes/{sae}").status_code == 200
    error(api(server, "GET", f"/api/saes/{sae}/labels"), 404, "sae_not_found")
    assert (
        api(server, "POST", "/api/saes", json={"path": str(sae_dirs["registered"])}).json()["id"]
        == sae
    )
    assert labels_of(server, sae) == {"3": "mine"}


def test_the_routes_are_in_the_openapi_schema(server):
    schema = api(server, "GET", "/openapi.json").json()
    assert set(schema["paths"]["/api/saes/{sae_id}/labels"]) == {"get", "put", "patch", "delete"}
    assert set(schema["paths"]["/api/saes/{sae_id}/features"]) == {"get"}
    assert set(schema["paths"]["/api/saes/{sae_id}/features/{index}"]) == {"get"}
    body = schema["paths"]["/api/saes/{sae_id}/labels"]["put"]["requestBody"]["content"]
    assert set(body) == {"application/json", "text/csv"}
    assert {
        ref["$ref"].rsplit("/", 1)[1] for ref in body["application/json"]["schema"]["anyOf"]
    } == {"NeuronpediaExplanations", "NeuronpediaFeatures", "MistudioLabels", "PlainLabels"}
    for name in ("FeatureDetail", "FeatureSearch", "FeatureHit", "LabelImport", "Neighbour"):
        assert name in schema["components"]["schemas"]


def test_labels_survive_a_restart(server, tiny_dirs):
    """Last: stops the module's server and starts another on the same data directory."""
    sae = server.ids["attached"]
    put(server, sae, {"0": "zero", "64": "sixty-four"})
    api(server, "DELETE", f"/api/saes/{server.ids['registered']}/labels")
    server.stop()
    again = ServerProcess(
        server.log_path.parent, ["--model", str(tiny_dirs["llama"])], env=server.env
    ).wait_ready()
    try:
        assert labels_of(again, sae) == {"0": "zero", "64": "sixty-four"}
        # cleared stays cleared: its file's labels are not brought back
        assert labels_of(again, server.ids["registered"]) == {}
        assert [f["index"] for f in search(again, sae, "sixty")["data"]] == [64]
    finally:
        again.stop()
