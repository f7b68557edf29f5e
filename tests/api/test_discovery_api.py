"""POST /api/saes/{id}/inspect and /contrast on a live server (tiny Llama, a ReLU SAE at layer 1):
aggregates, per-token values and steered reads equal an offline encode of residuals captured by a
hook on a stock transformers model (position 0 skipped); a contrast ranks first the feature the
SAE was built to fire on a token only set a holds, with numpy's Cohen's d; reads are never
steered unless asked and never monitored; every refusal with its code."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from millm.interp.formats import read_sae
from tests.api.clients import MODEL, api, error, post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens, sae_tensors

LAYER = 1
BUILT = 7  # the feature built to fire on MARK only
MARK = " café"  # one token of the tiny tokenizer, in set a's texts only
MAX_TEXTS, MAX_TOKENS = 6, 250  # the server's caps, small so refusals are cheap to reach
TEXT = "My friend reads the city of France quickly."
SET_A = [
    "The cat runs café quickly.",
    "My friend reads the café.",
    "A river is a café.",
    "Every feature counts café twice.",
]
SET_B = [
    "The cat runs quickly.",
    "My friend reads the city.",
    "A river is a model.",
    "Every feature counts twice.",
    "Paris is naïve.",
]


@pytest.fixture(scope="module")
def offline(tiny_dirs):
    """The stock model and tokenizer, with a hook at LAYER that adds `delta` and keeps the
    result."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    hooked = {"delta": None}

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if hooked["delta"] is not None:
            hidden = hidden + hooked["delta"]
        hooked["residual"] = hidden[0].clone()
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    model.model.layers[LAYER].register_forward_hook(hook)

    def residual(ids: list[int], delta: torch.Tensor | None = None) -> torch.Tensor:
        hooked["delta"] = delta
        with torch.no_grad():
            model(torch.tensor([ids]))
        return hooked["residual"]

    return tokenizer, residual


@pytest.fixture(scope="module")
def sae_dir(tmp_path_factory, offline):
    """A random ReLU SAE whose feature BUILT is fitted (least squares over the sets' read positions)
    to read 10, 11, 12, 13 at MARK in set a's texts and -1 everywhere else, so it fires on MARK
    only."""
    tokenizer, residual = offline
    tensors = sae_tensors(64, 128, seed=5)
    mark = tokenizer(MARK, add_special_tokens=False)["input_ids"]
    assert len(mark) == 1
    rows, targets = [], []
    for i, text in enumerate(SET_A + SET_B):
        ids = tokenizer(text)["input_ids"]
        centred = residual(ids) - tensors["b_dec"]
        for position in range(1, len(ids)):
            rows.append(torch.cat([centred[position], torch.ones(1)]))
            targets.append(10.0 + i if ids[position] == mark[0] else -1.0)
    solution = (
        torch.linalg.lstsq(torch.stack(rows).double(), torch.tensor(targets).double().unsqueeze(1))
        .solution[:, 0]
        .float()
    )
    tensors["W_enc"][:, BUILT], tensors["b_enc"][BUILT] = solution[:-1], solution[-1]
    return build_saelens(
        tmp_path_factory.mktemp("discovery-sae") / "sae",
        layer=LAYER,
        architecture="standard",
        tensors=tensors,
    )


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dir):
    env = {
        "MILLM_DISCOVERY_MAX_TEXTS": str(MAX_TEXTS),
        "MILLM_DISCOVERY_MAX_TOKENS": str(MAX_TOKENS),
    }
    process = ServerProcess(
        tmp_path_factory.mktemp("discovery-home"), ["--model", str(tiny_dirs["llama"])], env=env
    )
    try:
        process.wait_ready()
        process.sae = post(process, "/api/saes", {"path": str(sae_dir)}).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        spare = build_saelens(tmp_path_factory.mktemp("discovery-spare") / "sae", layer=2, seed=9)
        # registered, never attached
        process.spare = post(process, "/api/saes", {"path": str(spare)}).json()["id"]
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def encode(offline, sae_dir):
    """Offline activations of a prompt at every position but the first `[n - 1, d_sae]`
    (optionally steered)."""
    _, residual = offline
    sae = read_sae(sae_dir)[1]

    def run(ids: list[int], strengths: dict[int, float] | None = None) -> torch.Tensor:
        delta = sae.direction(strengths) if strengths else None
        with torch.no_grad():
            return sae.encode(residual(ids, delta))[1:]

    return run


def answer(server, route: str, body: dict) -> dict:
    response = post(server, f"/api/saes/{server.sae}/{route}", body)
    assert response.status_code == 200, response.text
    return response.json()


def expected_ranking(acts: torch.Tensor, sort: str, top_k: int) -> list[int]:
    high, mean, count = acts.max(0).values, acts.mean(0), (acts > 0).sum(0)
    key = {"max": high, "mean": mean, "count": count.float()}[sort]
    fired = [i for i in range(acts.shape[1]) if count[i] > 0]
    return sorted(fired, key=lambda i: (-float(key[i]), -float(high[i]), i))[:top_k]


# inspect ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sort", ["max", "mean", "count"])
def test_inspect_aggregates_equal_an_offline_encode(server, offline, encode, sort):
    tokenizer, _ = offline
    ids = tokenizer(TEXT)["input_ids"]
    acts = encode(ids)
    got = answer(server, "inspect", {"text": TEXT, "top_k": 12, "sort": sort})
    assert (
        got["object"] == "sae.inspect"
        and got["model"] == MODEL
        and got["sae_id"] == server.sae
        and got["layer"] == LAYER
    )
    assert got["steered"] is False and got["steering"] == {"kind": "none", "params": {}}
    assert got["prompt_tokens"] == len(ids)
    assert [(t["position"], t["token_id"]) for t in got["tokens"]] == [
        (p, ids[p]) for p in range(1, len(ids))
    ]
    assert [t["token"] for t in got["tokens"]] == [tokenizer.decode([i]) for i in ids[1:]]
    assert [f["index"] for f in got["features"]] == expected_ranking(acts, sort, 12)
    for feature in got["features"]:
        column = acts[:, feature["index"]]
        assert feature["max"] == pytest.approx(float(column.max()), rel=1e-4, abs=1e-4)
        assert feature["mean"] == pytest.approx(float(column.mean()), rel=1e-4, abs=1e-4)
        assert feature["count"] == int((column > 0).sum())
        assert feature["max_position"] == 1 + int(column.argmax())
        assert feature["label"] == f"feature {feature['index']} " + (
            "paris" if feature["index"] % 10 == 0 else "river"
        )
    assert "activations" not in got or got["activations"] is None


def test_per_token_activations_of_a_chosen_feature(server, offline, encode):
    tokenizer, _ = offline
    ids = tokenizer(TEXT)["input_ids"]
    acts = encode(ids)
    chosen = int(acts.max(0).values.argmax())
    got = answer(server, "inspect", {"text": TEXT, "feature": chosen, "top_k": 1})["activations"]
    assert got["index"] == chosen and got["label"].startswith(f"feature {chosen} ")
    assert [(v["position"], v["token"]) for v in got["values"]] == [
        (p, tokenizer.decode([ids[p]])) for p in range(1, len(ids))
    ]
    assert [v["value"] for v in got["values"]] == pytest.approx(
        acts[:, chosen].tolist(), rel=1e-4, abs=1e-4
    )
    # a feature that fires at few or no positions is still listed per token
    quiet = int((acts > 0).sum(0).argmin())
    values = answer(server, "inspect", {"text": TEXT, "feature": quiet})["activations"]["values"]
    assert [v["value"] for v in values] == pytest.approx(
        acts[:, quiet].tolist(), rel=1e-4, abs=1e-4
    )


def test_messages_are_rendered_with_the_chat_template(server, offline, encode):
    tokenizer, _ = offline
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )["input_ids"]
    got = answer(server, "inspect", {"messages": messages, "top_k": 5, "feature": 3})
    assert got["prompt_tokens"] == len(ids) and [t["token_id"] for t in got["tokens"]] == ids[1:]
    assert [v["value"] for v in got["activations"]["values"]] == pytest.approx(
        encode(ids)[:, 3].tolist(), rel=1e-4, abs=1e-4
    )


def test_steered_only_when_asked_and_by_the_plan_asked_for(server, offline, encode):
    tokenizer, _ = offline
    ids = tokenizer(TEXT)["input_ids"]
    plain, steered = encode(ids), encode(ids, {5: 4.0})
    assert not torch.allclose(plain, steered, atol=1e-3)  # the steering moves this read

    def values(extra: dict) -> tuple[dict, list[float]]:
        got = answer(server, "inspect", {"text": TEXT, "feature": 5, **extra})
        return got, [v["value"] for v in got["activations"]["values"]]

    by_features, read = values({"steering": {"features": [{"index": 5, "strength": 4.0}]}})
    assert by_features["steered"] is True and by_features["steering"] == {
        "kind": "features",
        "params": {"features": 1},
    }
    assert read == pytest.approx(steered[:, 5].tolist(), rel=1e-4, abs=1e-4)

    live = api(server, "PUT", f"/api/steering/saes/{server.sae}/features/5", json={"strength": 4.0})
    assert live.status_code == 200, live.text
    profile = post(
        server,
        "/api/profiles",
        {
            "name": "discovery-five",
            "steering": [{"sae_id": server.sae, "features": [{"index": 5, "strength": 4.0}]}],
        },
    )
    assert profile.status_code == 201, profile.text
    try:
        unasked, read = values({})  # live steering is on, but a read is unsteered unless it asks
        assert unasked["steered"] is False and read == pytest.approx(
            plain[:, 5].tolist(), rel=1e-4, abs=1e-4
        )
        as_live, read = values({"steering": "live"})
        assert as_live["steered"] is True and as_live["steering"]["kind"] == "live"
        assert read == pytest.approx(steered[:, 5].tolist(), rel=1e-4, abs=1e-4)
        by_profile, read = values({"steering": {"profile": "discovery-five"}})
        assert by_profile["steering"] == {
            "kind": "profile",
            "params": {"name": "discovery-five", "scope": "request"},
        }
        assert read == pytest.approx(steered[:, 5].tolist(), rel=1e-4, abs=1e-4)
    finally:
        api(server, "DELETE", f"/api/steering/saes/{server.sae}/features/5")
        api(server, "DELETE", f"/api/profiles/{profile.json()['id']}")
    off, read = values({"steering": "live"})  # nothing live any more: the live plan steers nothing
    assert off["steered"] is False and read == pytest.approx(
        plain[:, 5].tolist(), rel=1e-4, abs=1e-4
    )


# contrast -----------------------------------------------------------------------------------------
def per_text(tokenizer, encode, texts: list[str], aggregate: str) -> np.ndarray:
    rows = [encode(tokenizer(text)["input_ids"]) for text in texts]
    return np.stack(
        [(r.max(0).values if aggregate == "max" else r.mean(0)).double().numpy() for r in rows]
    )


def numpy_d(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    pooled = np.sqrt(
        ((len(a) - 1) * a.var(0, ddof=1) + (len(b) - 1) * b.var(0, ddof=1)) / (len(a) + len(b) - 2)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        return (a.mean(0) - b.mean(0)) / pooled


@pytest.mark.parametrize("aggregate", ["max", "mean"])
def test_contrast_ranks_the_feature_built_for_set_a_first(server, offline, encode, aggregate):
    tokenizer, _ = offline
    a, b = (
        per_text(tokenizer, encode, SET_A, aggregate),
        per_text(tokenizer, encode, SET_B, aggregate),
    )
    assert (a[:, BUILT] > 1).all() and (
        b[:, BUILT] == 0
    ).all()  # the construction: it fires on MARK only
    d = numpy_d(a, b)
    got = answer(
        server,
        "contrast",
        {"a": {"texts": SET_A}, "b": {"texts": SET_B}, "aggregate": aggregate, "top_k": 5},
    )
    assert (
        got["object"] == "sae.contrast"
        and got["aggregate"] == aggregate
        and got["steered"] is False
    )
    assert got["a"]["texts"] == len(SET_A) and got["b"]["texts"] == len(SET_B)
    assert got["a"]["tokens"] == sum(len(tokenizer(t)["input_ids"]) for t in SET_A)
    first = got["favouring_a"][0]
    assert first["index"] == BUILT and first["label"] == f"feature {BUILT} river"
    assert first["effect_size"] == pytest.approx(d[BUILT], rel=1e-4)
    assert first["mean_a"] == pytest.approx(a[:, BUILT].mean(), rel=1e-4) and first["mean_b"] == 0
    assert first["difference"] == pytest.approx(a[:, BUILT].mean(), rel=1e-4)
    assert (first["fired_a"], first["fired_b"]) == (len(SET_A), 0)
    for side, sign in (("favouring_a", 1), ("favouring_b", -1)):
        listed = got[side]
        assert 0 < len(listed) <= 5
        finite = np.where(np.isfinite(d), d, 0)
        order = sorted(
            (i for i in range(d.shape[0]) if sign * finite[i] > 0), key=lambda i: -sign * finite[i]
        )
        assert [f["index"] for f in listed] == order[:5]
        for feature in listed:
            i = feature["index"]
            assert feature["effect_size"] == pytest.approx(d[i], rel=1e-3, abs=1e-4)
            assert feature["mean_a"] == pytest.approx(a[:, i].mean(), rel=1e-4, abs=1e-4)
            assert feature["mean_b"] == pytest.approx(b[:, i].mean(), rel=1e-4, abs=1e-4)


def test_a_contrast_of_one_text_a_set_ranks_by_the_difference(server, offline, encode):
    # no variance to pool: every feature that differs has an infinite d (null), and the lists
    # rank by the difference, largest first
    tokenizer, _ = offline
    a = per_text(tokenizer, encode, SET_A[:1], "max")[0]
    b = per_text(tokenizer, encode, SET_B[:1], "max")[0]
    got = answer(server, "contrast", {"a": {"texts": SET_A[:1]}, "b": {"texts": SET_B[:1]}})
    difference = a - b
    expected = sorted(np.flatnonzero(difference > 1e-4), key=lambda i: (-difference[i], i))
    listed = got["favouring_a"]
    assert [f["index"] for f in listed] == [int(i) for i in expected[: len(listed)]]
    assert listed and all(f["effect_size"] is None for f in listed)
    assert listed[0]["difference"] == pytest.approx(difference[expected[0]], rel=1e-4)


def test_contrast_of_conversations(server, offline, encode):
    tokenizer, _ = offline

    def chat(text: str) -> list[dict]:
        return [{"role": "user", "content": text}]

    got = answer(
        server,
        "contrast",
        {
            "a": {"conversations": [chat(t) for t in SET_A]},
            "b": {"conversations": [chat(t) for t in SET_B]},
            "top_k": 3,
        },
    )
    rendered = [
        tokenizer.apply_chat_template(chat(t), add_generation_prompt=True, tokenize=False)
        for t in SET_A + SET_B
    ]
    rows = [
        encode(tokenizer(r, add_special_tokens=False)["input_ids"]).max(0).values.double().numpy()
        for r in rendered
    ]
    d = numpy_d(np.stack(rows[: len(SET_A)]), np.stack(rows[len(SET_A) :]))
    # (BUILT was fitted on the plain texts: in chat turns it is one feature among others)
    finite = np.where(np.isfinite(d), d, 0)
    for side, best in (
        ("favouring_a", int(finite.argmax())),
        ("favouring_b", int(finite.argmin())),
    ):
        assert got[side][0]["index"] == best
        assert got[side][0]["effect_size"] == pytest.approx(d[best], rel=1e-4)


def test_contrast_steered_when_asked(server, offline, encode):
    tokenizer, _ = offline
    strengths = {9: 3.0}

    def values(texts: list[str]) -> np.ndarray:
        return np.stack(
            [
                encode(tokenizer(t)["input_ids"], strengths).max(0).values.double().numpy()
                for t in texts
            ]
        )

    d = numpy_d(values(SET_A), values(SET_B))
    body = {
        "a": {"texts": SET_A},
        "b": {"texts": SET_B},
        "top_k": 2,
        "steering": {"features": [{"index": 9, "strength": 3.0}]},
    }
    got = answer(server, "contrast", body)
    assert got["steered"] is True and got["steering"]["kind"] == "features"
    top = got["favouring_a"][0]
    assert top["index"] == int(np.nanargmax(np.where(np.isfinite(d), d, np.nan)))
    assert top["effect_size"] == pytest.approx(d[top["index"]], rel=1e-4)


def test_reads_are_never_monitored(server):
    assert (
        api(
            server, "PUT", "/api/monitoring", json={"enabled": True, "positions": "all"}
        ).status_code
        == 200
    )
    api(server, "POST", "/api/monitoring/reset")
    try:
        answer(server, "inspect", {"text": TEXT})
        answer(server, "contrast", {"a": {"texts": SET_A}, "b": {"texts": SET_B}})
        generated = post(
            server, "/v1/completions", {"model": MODEL, "prompt": "The cat", "max_tokens": 2}
        )
        assert generated.status_code == 200
        deadline = time.monotonic() + 10
        while (
            not (records := api(server, "GET", "/api/monitoring/records").json()["data"])
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert len(records) == 1  # the completion, and nothing of the reads
    finally:
        api(server, "POST", "/api/monitoring/disable")


def test_routes_are_in_the_openapi_schema(server):
    paths = api(server, "GET", "/openapi.json").json()["paths"]
    for route in ("inspect", "contrast"):
        operation = paths[f"/api/saes/{{sae_id}}/{route}"]["post"]
        assert "requestBody" in operation and "200" in operation["responses"]


# refusals -----------------------------------------------------------------------------------------
# 252 tokens: over MAX_TOKENS, within the context window
LONG = " ".join(["one two three four five"] * 50)


@pytest.mark.parametrize(
    "route, body, status, code, param",
    [
        ("inspect", {"text": TEXT, "feature": 128}, 400, "invalid_feature_index", "feature"),
        ("inspect", {}, 400, "invalid_parameter", None),
        (
            "inspect",
            {"text": TEXT, "messages": [{"role": "user", "content": "hi"}]},
            400,
            "invalid_parameter",
            None,
        ),
        ("inspect", {"text": TEXT, "top_k": 0}, 400, "invalid_parameter", "top_k"),
        ("inspect", {"text": TEXT, "top_k": 257}, 400, "invalid_parameter", "top_k"),
        ("inspect", {"text": TEXT, "sort": "median"}, 400, "invalid_parameter", "sort"),
        ("inspect", {"text": TEXT, "colour": "blue"}, 400, "invalid_parameter", "colour"),
        (
            "inspect",
            {"text": ""},
            400,
            "invalid_parameter",
            "text",
        ),  # the BOS alone: nothing after the skipped position
        ("inspect", {"text": LONG}, 400, "invalid_parameter", "text"),
        ("inspect", {"text": TEXT, "model": "no-such-model"}, 404, "model_not_found", "model"),
        ("inspect", {"text": TEXT, "steering": "on"}, 400, "invalid_parameter", "steering"),
        (
            "inspect",
            {"text": TEXT, "steering": {"profile": "nobody"}},
            404,
            "profile_not_found",
            "steering.profile",
        ),
        (
            "inspect",
            {"text": TEXT, "steering": {"features": [{"index": 128, "strength": 1.0}]}},
            400,
            "invalid_feature_index",
            "steering.features[0].index",
        ),
        (
            "inspect",
            {"text": TEXT, "steering": {"features": [{"index": 1, "strength": 500.0}]}},
            400,
            "invalid_parameter",
            "steering.features[0].strength",
        ),
        (
            "inspect",
            {
                "text": TEXT,
                "steering": {"features": [{"sae_id": "SPARE", "index": 1, "strength": 1.0}]},
            },
            400,
            "sae_not_attached",
            "steering.features[0].sae_id",
        ),
        (
            "inspect",
            {
                "text": TEXT,
                "steering": {
                    "features": [{"sae_id": "sae_000000000000", "index": 1, "strength": 1.0}]
                },
            },
            404,
            "sae_not_found",
            "steering.features[0].sae_id",
        ),
        (
            "inspect",
            {
                "text": TEXT,
                "steering": {
                    "features": [{"index": 1, "strength": 1.0}, {"index": 1, "strength": 2.0}]
                },
            },
            400,
            "invalid_parameter",
            "steering.features[1]",
        ),
        (
            "contrast",
            {"a": {"texts": SET_A}, "b": {"texts": []}},
            400,
            "invalid_parameter",
            "b.texts",
        ),
        ("contrast", {"a": {"texts": SET_A}, "b": {}}, 400, "invalid_parameter", "b"),
        (
            "contrast",
            {"a": {"texts": SET_A}, "b": {"texts": SET_B * 2}},
            400,
            "invalid_parameter",
            "b.texts",
        ),
        (
            "contrast",
            {"a": {"texts": SET_A}, "b": {"texts": ["The cat runs.", ""]}},
            400,
            "invalid_parameter",
            "b.texts[1]",
        ),
        (
            "contrast",
            {
                "a": {"texts": SET_A},
                "b": {"texts": [" ".join(["one two three four five"] * 10)] * 5},
            },
            400,
            "invalid_parameter",
            "b.texts[4]",
        ),
        (
            "contrast",
            {"a": {"texts": SET_A}, "b": {"texts": SET_B}, "aggregate": "count"},
            400,
            "invalid_parameter",
            "aggregate",
        ),
        (
            "contrast",
            {"a": {"conversations": [[]]}, "b": {"texts": SET_B}},
            400,
            "invalid_parameter",
            "a.conversations[0]",
        ),
    ],
)
def test_refusals(server, route, body, status, code, param):
    body = {**body}
    if "steering" in body and isinstance(body["steering"], dict) and "features" in body["steering"]:
        body["steering"] = {
            "features": [
                {**f, "sae_id": server.spare} if f.get("sae_id") == "SPARE" else f
                for f in body["steering"]["features"]
            ]
        }
    found = error(post(server, f"/api/saes/{server.sae}/{route}", body), status, code)
    if param is not None:
        assert found["param"] == param, found


def test_unknown_and_unattached_saes(server):
    for route, body in (
        ("inspect", {"text": TEXT}),
        ("contrast", {"a": {"texts": SET_A}, "b": {"texts": SET_B}}),
    ):
        error(post(server, f"/api/saes/sae_000000000000/{route}", body), 404, "sae_not_found")
        refused = error(
            post(server, f"/api/saes/{server.spare}/{route}", body), 400, "sae_not_attached"
        )
        assert refused["param"] == "sae_id" and "attach it first" in refused["message"]


def test_total_tokens_message_names_the_cap(server):
    refused = error(
        post(server, f"/api/saes/{server.sae}/inspect", {"text": LONG}), 400, "invalid_parameter"
    )
    assert (
        "MILLM_DISCOVERY_MAX_TOKENS" in refused["message"] and str(MAX_TOKENS) in refused["message"]
    )
    too_many = error(
        post(
            server,
            f"/api/saes/{server.sae}/contrast",
            {"a": {"texts": SET_A}, "b": {"texts": SET_B * 2}},
        ),
        400,
    )
    assert "MILLM_DISCOVERY_MAX_TEXTS" in too_many["message"]
    short = error(post(server, f"/api/saes/{server.sae}/inspect", {"text": ""}), 400)
    assert "at least 2 tokens" in short["message"]
