"""Probes watching requests on a live server (tiny Llama, a TopK SAE attached at layer 1): verdicts
in bodies equal offline verdicts on residuals captured by a stock transformers model; the
probe-verdict chunk's place in a stream; saved, inline and active probes; monitoring records;
every refusal; scoring and embeddings never probed."""

from __future__ import annotations

import time

import pytest
import torch

from millm.interp.formats import read_sae
from tests.api.clients import MODEL, answer_events, api, error, post, sse_events
from tests.support.probe_server import probe_saes, probe_server

LAYER = 1
PROMPT = "The old river runs quickly to the sea, and"
COMPLETION = {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0}
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about the sea."}],
    "max_tokens": 8,
    "temperature": 0,
}
FEATURE_GAP, LINEAR_GAP = (
    0.05,
    0.002,
)  # a threshold sits this far from every score (server and offline differ in the last bits)


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    return probe_saes(tmp_path_factory.mktemp("verdict-saes"))


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dirs):
    with probe_server(
        tmp_path_factory.mktemp("verdict-home"), tiny_dirs["llama"], sae_dirs
    ) as process:
        yield process


@pytest.fixture
def quiet(server):
    """No saved probes, monitoring off."""
    for probe in api(server, "GET", "/api/probes").json()["data"]:
        api(server, "DELETE", f"/api/probes/{probe['id']}")
    api(server, "PUT", "/api/monitoring", json={"enabled": False})
    return server


@pytest.fixture(scope="module")
def offline(tiny_dirs, sae_dirs):
    """Residuals after block LAYER of a stock transformers model, over given token ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    captured = {}
    model.model.layers[LAYER].register_forward_hook(
        lambda m, a, output: captured.__setitem__(
            "h", output[0] if isinstance(output, tuple) else output
        )
    )

    def residuals(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            model(torch.tensor([ids]))
        return captured["h"][0]

    return {
        "residuals": residuals,
        "sae": read_sae(sae_dirs["main"])[1],
        "tokenizer": AutoTokenizer.from_pretrained(str(tiny_dirs["llama"])),
    }


def split(scores: list[float], gap: float) -> float:
    """A threshold between two of the scores, at least `gap` from each, reached by some but not
    all."""
    ordered = sorted(scores)
    candidates = [
        (ordered[i - 1] + ordered[i]) / 2
        for i in range(1, len(ordered))
        if ordered[i] - ordered[i - 1] > 2 * gap
    ]
    assert candidates, "no gap to put a threshold in"
    return min(candidates, key=lambda t: abs(sum(s >= t for s in scores) - len(scores) / 3))


def expected(scores: list[float], threshold: float, token_ids: list[int], tokenizer) -> dict:
    """The verdict over every position but the first (the attention sink, which a probe never
    scores)."""
    hits = [p for p, s in enumerate(scores) if s >= threshold and p >= 1]
    peak = max(range(1, len(scores)), key=lambda p: (scores[p], -p))
    return {
        "fired": bool(hits),
        "first_position": hits[0] if hits else None,
        "peak_position": peak,
        "positions": hits,
        "tokens": [{"id": token_ids[p], "text": tokenizer.decode([token_ids[p]])} for p in hits],
    }


def fed_tokens(server, body: dict) -> list[int]:
    """Every position's token that the model was fed (prompt, then each generated token but the
    last)."""
    ask = {"sae_id": server.sae, "positions": "all", "top_k": 1}
    answer = post(server, "/v1/completions", {**body, "return_sae_activations": ask}).json()
    return [p["token_id"] for p in answer["millm"]["sae_activations"]["positions"]]


def test_verdicts_equal_offline_verdicts_on_captured_residuals(quiet, offline):
    ids = fed_tokens(quiet, COMPLETION)
    resid = offline["residuals"](ids)
    acts = offline["sae"].encode(resid)
    index = int((acts > 0).sum(dim=0).argmax())
    feature_scores = acts[:, index].tolist()
    weights = torch.randn(64, generator=torch.Generator().manual_seed(9)) / 8
    linear_scores = torch.sigmoid(resid @ weights - 0.1).tolist()
    thresholds = {
        "feat": split(feature_scores[1:], FEATURE_GAP),
        "lin": split(linear_scores[1:], LINEAR_GAP),
    }
    probes = [
        {
            "name": "feat",
            "detector": {
                "type": "feature",
                "sae_id": quiet.sae,
                "index": index,
                "threshold": thresholds["feat"],
            },
        },
        {
            "name": "lin",
            "detector": {
                "type": "linear",
                "layer": LAYER,
                "weights": weights.tolist(),
                "bias": -0.1,
                "threshold": thresholds["lin"],
            },
        },
    ]
    plain = post(quiet, "/v1/completions", COMPLETION).json()
    assert "millm" not in plain  # nothing watched, nothing asked: no millm key at all
    answer = post(quiet, "/v1/completions", {**COMPLETION, "probes": probes})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["choices"][0]["text"] == plain["choices"][0]["text"]  # a probe only watches
    entries = {e["name"]: e for e in body["millm"]["probes"]}
    assert list(entries) == ["feat", "lin"]
    for name, scores in (("feat", feature_scores), ("lin", linear_scores)):
        entry = entries[name]
        want = expected(scores, thresholds[name], ids, offline["tokenizer"])
        assert {key: entry[key] for key in want} == want, name
        assert 0 < len(entry["positions"]) < len(ids)
        assert entry["peak"] == pytest.approx(max(scores[1:]), rel=1e-4, abs=1e-5)
        assert (
            entry["index"],
            entry["action"],
            entry["acted_at"],
            entry["source"],
            entry["threshold"],
        ) == (0, "report", None, "request", thresholds[name])


def test_the_verdict_chunk_comes_after_the_content_and_before_the_activations(quiet):
    probe = {
        "name": "any",
        "detector": {"type": "feature", "sae_id": quiet.sae, "index": 3, "threshold": 0.01},
    }
    ask = {"sae_id": quiet.sae, "positions": "last", "top_k": 2}
    body = {**CHAT, "probes": [probe], "return_sae_activations": ask}
    whole = post(quiet, "/v1/chat/completions", body).json()
    streamed = post(
        quiet,
        "/v1/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = answer_events(sse_events(streamed.text))
    *chunks, usage, verdicts, activations, _ = events
    assert any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)
    assert usage["choices"] == [] and "usage" in usage and "millm" not in usage
    assert (
        verdicts["choices"] == []
        and verdicts["object"] == "chat.completion.chunk"
        and list(verdicts["millm"]) == ["probes"]
    )
    assert activations["choices"] == [] and list(activations["millm"]) == ["sae_activations"]
    assert verdicts["millm"]["probes"] == whole["millm"]["probes"]
    assert whole["millm"]["sae_activations"] == activations["millm"]["sae_activations"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == whole["choices"][0]["message"]["content"]


def test_one_entry_per_probe_per_choice(quiet):
    probes = [
        {
            "name": "a",
            "detector": {"type": "feature", "sae_id": quiet.sae, "index": 2, "threshold": 0.5},
        },
        {
            "detector": {
                "type": "weighted",
                "sae_id": quiet.sae,
                "features": [{"index": 2, "weight": 1}],
                "threshold": 0.5,
            }
        },
    ]
    body = {
        **CHAT,
        "extra_messages": [[{"role": "user", "content": "And rivers?"}]],
        "n": 2,
        "temperature": 0.8,
        "seed": 3,
        "probes": probes,
    }
    entries = post(quiet, "/v1/chat/completions", body).json()["millm"]["probes"]
    assert [(e["index"], e["name"]) for e in entries] == [
        (i, name) for i in range(4) for name in ("a", "probes[1]")
    ]
    for a, b in zip(
        entries[::2], entries[1::2], strict=True
    ):  # the same feature, weight 1: the same verdict
        assert {k: v for k, v in a.items() if k != "name"} == {
            k: v for k, v in b.items() if k != "name"
        }


def test_saved_and_active_probes(quiet):
    assert (
        post(
            quiet,
            "/api/probes",
            {
                "name": "saved",
                "detector": {"type": "feature", "sae_id": quiet.sae, "index": 4, "threshold": 0.5},
            },
        ).status_code
        == 201
    )
    watcher = {
        "name": "watcher",
        "detector": {"type": "linear", "layer": 2, "weights": [0.01] * 64, "threshold": 0.5},
    }
    assert post(quiet, "/api/probes", watcher).status_code == 201
    assert api(quiet, "POST", "/api/probes/watcher/activate").status_code == 200

    plain = post(quiet, "/v1/completions", COMPLETION).json()["millm"]["probes"]
    assert [(e["name"], e["source"]) for e in plain] == [("watcher", "active")]
    named = post(quiet, "/v1/completions", {**COMPLETION, "probes": ["saved", "watcher"]}).json()[
        "millm"
    ]["probes"]
    assert [(e["name"], e["source"]) for e in named] == [
        ("saved", "request"),
        ("watcher", "active"),
    ]  # watched once
    assert named[1] == plain[0]
    streamed = answer_events(
        sse_events(post(quiet, "/v1/completions", {**COMPLETION, "stream": True}).text)
    )
    assert streamed[-2]["millm"]["probes"] == plain and streamed[-2]["choices"] == []

    clash = {
        "name": "watcher",
        "detector": {"type": "feature", "sae_id": quiet.sae, "index": 1, "threshold": 1},
    }
    assert (
        error(post(quiet, "/v1/completions", {**COMPLETION, "probes": [clash]}), 400)["param"]
        == "probes[0].name"
    )

    # An active probe that no longer fits the model (its SAE detached) is skipped, and the body says
    # so.
    assert post(quiet, f"/api/saes/{quiet.other}/attach", {}).status_code == 200
    post(
        quiet,
        "/api/probes",
        {
            "name": "elsewhere",
            "detector": {"type": "feature", "sae_id": quiet.other, "index": 4, "threshold": 0.5},
        },
    )
    assert api(quiet, "POST", "/api/probes/elsewhere/activate").status_code == 200
    assert post(quiet, f"/api/saes/{quiet.other}/detach", {}).status_code == 200
    millm = post(quiet, "/v1/completions", COMPLETION).json()["millm"]
    assert [e["name"] for e in millm["probes"]] == ["watcher"]
    assert [s["name"] for s in millm["probes_skipped"]] == [
        "elsewhere"
    ] and "is not attached" in millm["probes_skipped"][0]["reason"]


def test_scoring_and_embeddings_are_never_probed(quiet):
    probe = {
        "name": "p",
        "detector": {"type": "feature", "sae_id": quiet.sae, "index": 4, "threshold": 0.5},
    }
    for path, body in [
        ("/v1/completions", {**COMPLETION, "max_tokens": 1, "logprobs": 2}),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 1, "logprobs": True}),
        ("/v1/embeddings", {"model": MODEL, "input": "hello"}),
    ]:
        refused = error(post(quiet, path, {**body, "probes": [probe]}), 400, "field_not_honoured")
        assert refused["param"] == "probes" and "never probed" in refused["message"], path
        # no probes: nothing to refuse
        assert post(quiet, path, {**body, "probes": []}).status_code == 200, path
    post(quiet, "/api/probes", probe)
    assert api(quiet, "POST", "/api/probes/p/activate").status_code == 200
    scored = post(quiet, "/v1/completions", {**COMPLETION, "max_tokens": 1, "logprobs": 2}).json()
    assert "millm" not in scored  # an active probe does not watch a scoring request either


@pytest.mark.parametrize(
    "probes, status, code, param",
    [
        (["missing"], 404, "probe_not_found", "probes[0]"),
        (
            [{"detector": {"type": "feature", "sae_id": "x", "index": 1}}],
            400,
            "invalid_probe",
            "probes[0].detector",
        ),
        (
            [{"detector": {"type": "feature", "sae_id": "x", "index": 1, "threshold": -1}}],
            400,
            "invalid_probe",
            "probes[0].detector.threshold",
        ),
        (
            [
                {
                    "name": "a",
                    "detector": {"type": "linear", "layer": 1, "weights": [0.0] * 64},
                    "colour": 1,
                }
            ],
            400,
            "invalid_probe",
            "probes[0].colour",
        ),
        (
            [
                {
                    "detector": {
                        "type": "feature",
                        "sae_id": "sae_000000000000",
                        "index": 1,
                        "threshold": 1,
                    }
                }
            ],
            400,
            "sae_not_attached",
            "probes[0].detector.sae_id",
        ),
        (
            [{"detector": {"type": "feature", "sae_id": "SAE", "index": 999, "threshold": 1}}],
            400,
            "invalid_feature_index",
            "probes[0].detector.index",
        ),
        (
            [{"detector": {"type": "feature", "sae_id": "SAE", "index": 1, "percentile": 50}}],
            400,
            "not_calibrated",
            "probes[0].detector.percentile",
        ),
        (
            [{"detector": {"type": "linear", "layer": 9, "weights": [0.0] * 64}}],
            400,
            "invalid_parameter",
            "probes[0].detector.layer",
        ),
        (
            [{"name": "a", "detector": {"type": "linear", "layer": 1, "weights": [0.0] * 64}}] * 2,
            400,
            "invalid_parameter",
            "probes[1]",
        ),
        ([f"p{i}" for i in range(17)], 400, "invalid_parameter", "probes"),
        ("saved", 400, "invalid_parameter", "probes"),
    ],
)
def test_refusals_name_the_probe(quiet, probes, status, code, param):
    if isinstance(probes, list):
        probes = [
            p
            if isinstance(p, str)
            else {
                **p,
                "detector": {k: (quiet.sae if v == "SAE" else v) for k, v in p["detector"].items()},
            }
            for p in probes
        ]
    for path, body in [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)]:
        refused = error(post(quiet, path, {**body, "probes": probes}), status, code)
        assert refused["param"] == param, (path, refused)


def test_monitoring_records_the_active_probes_verdicts(quiet):
    post(
        quiet,
        "/api/probes",
        {
            "name": "watched",
            "detector": {"type": "feature", "sae_id": quiet.sae, "index": 4, "threshold": 0.2},
        },
    )
    assert api(quiet, "POST", "/api/probes/watched/activate").status_code == 200
    assert (
        api(
            quiet, "PUT", "/api/monitoring", json={"enabled": True, "sae_id": quiet.sae, "top_k": 2}
        ).status_code
        == 200
    )
    try:
        last = api(quiet, "GET", "/api/monitoring/records", params={"limit": 1}).json()["data"]
        after = last[-1]["id"] if last else 0
        request_only = {
            "name": "mine",
            "detector": {"type": "feature", "sae_id": quiet.sae, "index": 5, "threshold": 0.2},
        }
        body = post(quiet, "/v1/completions", {**COMPLETION, "probes": [request_only]}).json()
        for _ in range(200):
            records = api(quiet, "GET", "/api/monitoring/records", params={"after": after}).json()[
                "data"
            ]
            if records:
                break
            time.sleep(0.05)
        [record] = records
        [entry] = [e for e in body["millm"]["probes"] if e["name"] == "watched"]
        [recorded] = record["probes"]  # the active probe's verdict only
        assert recorded == {
            **{k: entry[k] for k in recorded if k != "token_ids"},
            "token_ids": [t["id"] for t in entry["tokens"]],
        }
        assert set(recorded) == {
            "name",
            "action",
            "fired",
            "first_position",
            "peak",
            "peak_position",
            "positions",
            "token_ids",
            "acted_at",
        }
    finally:
        api(quiet, "PUT", "/api/monitoring", json={"enabled": False})
