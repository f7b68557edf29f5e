"""return_sae_activations on a live server (tiny Llama, three SAEs attached, steering on): the
values equal an offline encode of residuals captured by hooks on a stock transformers model,
for ReLU, JumpReLU and TopK SAEs and both read points; the response shapes; token text and
feature labels when asked (and the spec's shape when not); every refusal."""

from __future__ import annotations

import httpx
import pytest
import torch
from transformers import AutoTokenizer

from millm.interp.formats import read_sae
from tests.api.clients import MODEL, answer_events, api, post, sse_events
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

ARCHITECTURES = {"standard": 0, "jumprelu": 1, "topk": 2}  # architecture -> layer
STRENGTHS = {"standard": {3: 6.0}, "jumprelu": {5: -4.0, 9: 3.0}, "topk": {1: 5.0}}


@pytest.fixture(scope="module")
def sae_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("act-saes")
    return {
        arch: build_saelens(base / arch, layer=layer, architecture=arch, seed=40 + layer)
        for arch, layer in ARCHITECTURES.items()
    }


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, sae_dirs):
    process = ServerProcess(
        tmp_path_factory.mktemp("act-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        ids = {}
        for arch, directory in sae_dirs.items():
            ids[arch] = post(process, "/api/saes", {"path": str(directory)}).json()["id"]
            assert post(process, f"/api/saes/{ids[arch]}/attach", {}).status_code == 200
            for index, strength in STRENGTHS[arch].items():
                response = httpx.put(
                    f"{process.base_url}/api/steering/saes/{ids[arch]}/features/{index}",
                    json={"strength": strength},
                )
                assert response.status_code == 200, response.text
        process.ids = ids
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def offline(tiny_dirs, sae_dirs):
    """A stock transformers model with the same steering added by hooks, capturing each SAE's
    layer."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    saes = {arch: read_sae(directory)[1] for arch, directory in sae_dirs.items()}
    captured = {}

    def hook_for(arch):
        delta = saes[arch].direction(STRENGTHS[arch])

        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            captured[arch] = (hidden.clone(), hidden + delta)
            return (hidden + delta, *output[1:]) if isinstance(output, tuple) else hidden + delta

        return hook

    for arch, layer in ARCHITECTURES.items():
        model.model.layers[layer].register_forward_hook(hook_for(arch))

    def run(token_ids: list[int], arch: str, read_point: str) -> torch.Tensor:
        with torch.no_grad():
            model(torch.tensor([token_ids]))
        before, after = captured[arch]
        residual = after if read_point == "post_steering" else before
        return saes[arch].encode(residual[0])

    return run


def read(server, body: dict, path: str = "/v1/completions") -> dict:
    response = post(server, path, body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("read_point", ["post_steering", "pre_steering"])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_values_equal_an_offline_encode_of_the_captured_residuals(
    server, offline, arch, read_point
):
    body = {
        "model": MODEL,
        "prompt": "The old river",
        "max_tokens": 6,
        "temperature": 0,
        "return_sae_activations": {
            "sae_id": server.ids[arch],
            "positions": "all",
            "top_k": 6,
            "read_point": read_point,
        },
    }
    answer = read(server, body)
    block = answer["millm"]["sae_activations"]
    assert (
        block["sae_id"] == server.ids[arch]
        and block["layer"] == ARCHITECTURES[arch]
        and block["read_point"] == read_point
    )
    assert answer["choices"][0]["finish_reason"] == "length"
    positions = block["positions"]
    prompt_tokens = answer["usage"]["prompt_tokens"]
    # Every fed position was read; the final sampled token never was.
    assert [p["position"] for p in positions] == list(range(prompt_tokens + 6 - 1))
    reference = offline([p["token_id"] for p in positions], arch, read_point)
    for entry in positions:
        expected = reference[entry["position"]]
        top = torch.topk(expected, 6)
        want = [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True) if v > 0]
        got = [(f["index"], f["value"]) for f in entry["features"]]
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-4, abs=1e-4)


def test_pre_and_post_differ_by_exactly_this_layers_delta(server):
    """With steering at this layer the two read points differ; the unsteered scoring read equals
    neither when steering is on."""
    base = {"model": MODEL, "prompt": "The old river", "max_tokens": 2, "temperature": 0}
    ask = {
        "sae_id": server.ids["standard"],
        "positions": "prompt",
        "features": [3, 4, 5],
        "top_k": 3,
    }
    post_read = read(
        server, {**base, "return_sae_activations": {**ask, "read_point": "post_steering"}}
    )["millm"]["sae_activations"]
    pre_read = read(
        server, {**base, "return_sae_activations": {**ask, "read_point": "pre_steering"}}
    )["millm"]["sae_activations"]
    scored = post(
        server,
        "/v1/completions",
        {**base, "max_tokens": 1, "logprobs": 1, "return_sae_activations": ask},
    )
    assert scored.status_code == 200 and scored.headers["x-millm-steering"] == "none"
    unsteered = scored.json()["millm"]["sae_activations"]
    assert unsteered["read_point"] == "unsteered"
    # Layer 0 is the first steered layer, so before its delta the residual is the unsteered one.
    assert unsteered["positions"] == pre_read["positions"]
    assert post_read["positions"] != pre_read["positions"]
    # Listed features are all reported, including ones that did not fire.
    assert all(len(p["features"]) == 3 for p in post_read["positions"])


def test_positions_words_and_ranges(server):
    base = {"model": MODEL, "prompt": "The old river", "max_tokens": 5, "temperature": 0}
    sae = server.ids["topk"]

    def positions(spec):
        answer = read(
            server,
            {**base, "return_sae_activations": {"sae_id": sae, "positions": spec, "top_k": 2}},
        )
        return answer["usage"]["prompt_tokens"], [
            p["position"] for p in answer["millm"]["sae_activations"]["positions"]
        ]

    prompt_tokens, last = positions("last")
    assert last == [prompt_tokens + 5 - 2]
    assert positions("prompt")[1] == list(range(prompt_tokens))
    assert positions("completion")[1] == list(range(prompt_tokens, prompt_tokens + 4))
    assert positions({"start": 1, "end": 3})[1] == [1, 2]
    assert positions({"start": prompt_tokens + 2, "end": 10_000})[1] == list(
        range(prompt_tokens + 2, prompt_tokens + 4)
    )


def test_chat_streaming_puts_the_block_in_a_final_chunk_before_done(server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_sae_activations": {
            "sae_id": server.ids["jumprelu"],
            "positions": "completion",
            "top_k": 3,
        },
    }
    events = answer_events(sse_events(post(server, "/v1/chat/completions", body).text))
    final = events[-2]
    assert final["choices"] == [] and set(final["millm"]) == {"sae_activations"}
    assert "usage" in events[-3] and "millm" not in events[-3]
    whole = read(server, {**body, "stream": False}, "/v1/chat/completions")
    assert whole["millm"] == final["millm"]
    assert "not an unsteered counterfactual" in whole["millm"]["sae_activations"]["note"]
    plain = read(
        server,
        {
            k: v
            for k, v in body.items()
            if k not in ("return_sae_activations", "stream", "stream_options")
        },
        "/v1/chat/completions",
    )
    assert "millm" not in plain


@pytest.mark.parametrize(
    "extra, ask, needle",
    [
        ({"n": 2}, {}, "n > 1"),
        ({"extra_messages": [[{"role": "user", "content": "x"}]]}, {}, "extra_messages"),
        ({}, {}, "several SAEs are attached"),
        ({}, {"sae_id": "sae_000000000000"}, "is not attached"),
        ({}, {"sae_id": "SAE", "features": [128]}, "past the width"),
        (
            {},
            {"sae_id": "SAE", "top_k": 65},
            "top_k: at most SAE_ACTIVATIONS_MAX_TOP_K (64), got 65",
        ),
        (
            {"max_tokens": 1100},
            {"sae_id": "SAE", "top_k": 64, "positions": "all"},
            "SAE_ACTIVATIONS_MAX_ENTRIES (65536)",
        ),
        (
            {},
            {"sae_id": "SAE", "positions": "middle"},
            "positions: one of last, prompt, completion, all",
        ),
        ({}, {"sae_id": "SAE", "positions": {"start": 5, "end": 5}}, "positions: 0 <= start < end"),
        ({}, {"sae_id": "SAE", "read_point": "inside"}, "read_point"),
        ({}, {"sae_id": "SAE", "colour": "blue"}, "return_sae_activations.colour: unknown key"),
        ({}, {"sae_id": "SAE", "tokens": "yes"}, "return_sae_activations.tokens: "),
        ({}, {"sae_id": "SAE", "labels": 1}, "return_sae_activations.labels: "),
    ],
)
def test_refusals_before_anything_is_generated(server, extra, ask, needle):
    ask = {k: (server.ids["topk"] if v == "SAE" else v) for k, v in ask.items()}
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        **extra,
        "return_sae_activations": ask,
    }
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert needle in error["message"]
    assert error["param"].startswith("return_sae_activations")
    if needle.startswith("return_sae_activations."):  # a key's own problem names that key
        assert error["param"] == needle.split(":")[0]
    if "past the width" in needle:
        assert error["code"] == "invalid_feature_index"


def test_several_prompts_and_embeddings_are_refused(server):
    several = post(
        server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": ["a", "b"],
            "return_sae_activations": {"sae_id": server.ids["topk"]},
        },
    )
    assert several.status_code == 400 and "several prompts" in several.json()["error"]["message"]
    embedded = post(
        server, "/v1/embeddings", {"model": MODEL, "input": "a", "return_sae_activations": {}}
    )
    assert embedded.status_code == 400 and embedded.json()["error"]["code"] == "field_not_honoured"


SPEC_POSITION_KEYS = {"position", "token_id", "features"}


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "The old river", "max_tokens": 4}),
        ("/v1/completions", {"prompt": "The old river", "max_tokens": 1, "logprobs": 2}),  # scoring
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hello river"}], "max_tokens": 4},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hello river"}],
                "max_tokens": 4,
                "stream": True,
            },
        ),
    ],
    ids=["completion", "scoring", "chat", "chat-stream"],
)
def test_tokens_and_labels_when_asked_and_the_spec_shape_otherwise(server, tiny_dirs, path, body):
    sae = server.ids["standard"]
    labelled = {"1": "first river", "3": "third river"}  # 2 and 4 stay unlabelled
    replaced = api(server, "PUT", f"/api/saes/{sae}/labels", json=labelled)
    assert replaced.status_code == 200, replaced.text
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs["llama"]))
    ask = {"sae_id": sae, "positions": "all", "features": [1, 2, 3, 4], "top_k": 4}

    def block(extra: dict) -> dict:
        sent = {
            "model": MODEL,
            "temperature": 0,
            **body,
            "return_sae_activations": {**ask, **extra},
        }
        response = post(server, path, sent)
        assert response.status_code == 200, response.text
        if not body.get("stream"):
            return response.json()["millm"]["sae_activations"]
        [final] = [e for e in sse_events(response.text) if e != "[DONE]" and "millm" in e]
        return final["millm"]["sae_activations"]

    readable = block({"tokens": True, "labels": True})
    assert readable["positions"]
    for entry in readable["positions"]:
        assert set(entry) == SPEC_POSITION_KEYS | {"token"}
        assert entry["token"] == tokenizer.decode(
            [entry["token_id"]], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert sorted(f["index"] for f in entry["features"]) == [1, 2, 3, 4]
        for feature in entry["features"]:
            assert feature["label"] == labelled.get(str(feature["index"]))
    # The same read without them is the spec's shape exactly, and the same numbers.
    for extra in ({}, {"tokens": False, "labels": False}):
        plain = block(extra)
        assert all(set(entry) == SPEC_POSITION_KEYS for entry in plain["positions"])
        assert all(
            set(f) == {"index", "value"} for entry in plain["positions"] for f in entry["features"]
        )
        assert plain["positions"] == [
            {
                "position": entry["position"],
                "token_id": entry["token_id"],
                "features": [{"index": f["index"], "value": f["value"]} for f in entry["features"]],
            }
            for entry in readable["positions"]
        ]
    only_tokens = block({"tokens": True})
    assert all("label" not in f for entry in only_tokens["positions"] for f in entry["features"])
    only_labels = block({"labels": True})
    assert all(set(entry) == SPEC_POSITION_KEYS for entry in only_labels["positions"])


def test_the_served_schema_documents_tokens_and_labels(server):
    schemas = api(server, "GET", "/openapi.json").json()["components"]["schemas"]
    for request in ("ChatCompletionRequest", "CompletionRequest"):
        field = schemas[request]["properties"]["return_sae_activations"]
        assert {"$ref": "#/components/schemas/ReadRequest"} in field["anyOf"]
        read = schemas["ReadRequest"]
        for key, says in (("tokens", "token_id decoded"), ("labels", "null for an unlabelled")):
            assert read["properties"][key]["type"] == "boolean"
            assert read["properties"][key]["default"] is False
            assert says in read["properties"][key]["description"]
        assert read["additionalProperties"] is False
