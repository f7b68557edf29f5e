"""A live server on the tiny Llama's GGUF file with --engine llama.cpp: the OpenAI surface over
millm's own loop (seeds, stops, structured output, a forced tool call, scoring, embeddings,
continuous batching), an attached SAE's steering, reads, probes and operators inside
llama.cpp's graph, and a dictionary trained on its reads and graded inside its graph."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from millm.interp.steering_hash import steering_set_hash
from tests.api.clients import api, attach_sae, error, finished_job, post, sdk
from tests.api.test_lens_api import reference as lens_reference
from tests.support.dictionary_reference import reference, transcoder_reference
from tests.support.server import ServerProcess
from tests.support.steering_header import member
from tests.support.tiny_saes import build_saelens

MODEL = "tiny-llama:F32"  # repo:QUANT, from the file name tiny-llama.F32.gguf


@pytest.fixture(scope="module")
def server(tiny_gguf, tmp_path_factory):
    home = tmp_path_factory.mktemp("cpp-home")
    saes = tmp_path_factory.mktemp("cpp-saes")
    args = ["--model", str(tiny_gguf), "--engine", "llama.cpp", "--dtype", "float32"]
    process = ServerProcess(home, args)
    try:
        process.wait_ready()
        process.sae_at = {
            layer: build_saelens(saes / f"layer{layer}", layer=layer, seed=layer)
            for layer in (0, 1)
        }
        yield process
    finally:
        process.stop()


def chat(content: str, **extra) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 24,
        "temperature": 0,
        **extra,
    }


def answer(server, body: dict) -> tuple[str, httpx.Response]:
    response = post(server, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"], response


def test_chat_runs_on_llamacpp_and_says_so(server):
    text, response = answer(server, chat("Tell me about the sea."))
    assert text and response.json()["system_fingerprint"].endswith("float32/F32:llama.cpp")
    streamed = sdk(server).chat.completions.create(**chat("Tell me about the sea."), stream=True)
    assert (
        "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == text
    )
    health = api(server, "GET", "/api/health/inference").json()
    assert health["engine"] == "llama.cpp"


def test_chat_template_kwargs_are_reported_on_llamacpp(server):
    """The spec's GGUF rule: accepted, not passed to the template, and named as ignored."""
    plain = answer(server, chat("Tell me about the sea."))[1]
    text, response = answer(
        server, chat("Tell me about the sea.", chat_template_kwargs={"enable_thinking": False})
    )
    assert response.headers["x-millm-ignored-fields"] == '"chat_template_kwargs"'
    assert response.json()["usage"]["prompt_tokens"] == plain.json()["usage"]["prompt_tokens"]


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_tool_choice_without_tools_is_reported_on_llamacpp(server, choice):
    plain = answer(server, chat("Tell me about the sea."))[0]
    text, response = answer(server, chat("Tell me about the sea.", tool_choice=choice))
    assert response.headers["x-millm-ignored-fields"] == '"tool_choice"' and text == plain


def test_seeds_stops_and_n(server):
    body = chat("Tell me about the moon.", temperature=1.0, seed=5, max_tokens=16)
    first, response = answer(server, body)
    assert answer(server, body)[0] == first and response.headers["x-millm-seed"].startswith("5")
    whole = answer(server, chat("Tell me about the moon."))[0]
    stop = whole[4:7]
    cut = post(server, "/v1/chat/completions", chat("Tell me about the moon.", stop=[stop])).json()[
        "choices"
    ][0]
    assert (
        cut["message"]["content"] == whole[: whole.index(stop)] and cut["finish_reason"] == "stop"
    )
    several = post(server, "/v1/chat/completions", chat("Hi", n=3, temperature=1.0, seed=9)).json()[
        "choices"
    ]
    assert len(several) == 3


def test_structured_output_and_a_forced_tool_call_parse(server):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    body = chat(
        "Name a city.",
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    text, _ = answer(server, body)
    assert set(json.loads(text)) == {"city"}
    tool = {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {
                "type": "object",
                "properties": {"day": {"type": "integer"}},
                "required": ["day"],
            },
        },
    }
    forced = {
        **chat("Weather?", max_tokens=60),
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "weather"}},
    }
    call = post(server, "/v1/chat/completions", forced).json()["choices"][0]["message"][
        "tool_calls"
    ][0]
    assert call["function"]["name"] == "weather" and isinstance(
        json.loads(call["function"]["arguments"])["day"], int
    )


def test_scoring_and_embeddings(server):
    scored = post(
        server,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": "The cat",
            "max_tokens": 1,
            "logprobs": 3,
            "temperature": 0,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    logprobs = scored["choices"][0]["logprobs"]
    top = logprobs["top_logprobs"][0]
    assert len(top) == 3 and max(top.values()) == logprobs["token_logprobs"][0] < 0
    vectors = post(server, "/v1/embeddings", {"model": MODEL, "input": ["a", "the cat"]}).json()[
        "data"
    ]
    assert len(vectors) == 2 and len(vectors[0]["embedding"]) == 64
    # Every pooling on llama.cpp too: its runner keeps each token's state.
    pooled = {
        pooling: post(
            server,
            "/v1/embeddings",
            {"model": MODEL, "input": ["a", "the cat"], "pooling": pooling, "normalize": True},
        ).json()["data"]
        for pooling in ("mean", "last", "cls")
    }
    for data in pooled.values():
        norms = [sum(x * x for x in entry["embedding"]) ** 0.5 for entry in data]
        assert norms == pytest.approx([1.0, 1.0], abs=1e-5)
    assert pooled["cls"][0]["embedding"] == pytest.approx(pooled["cls"][1]["embedding"], abs=1e-5)
    assert pooled["last"][1]["embedding"] != pytest.approx(pooled["mean"][1]["embedding"], abs=1e-3)


def test_an_oversized_prompt_is_a_400_with_both_counts(server):
    body = chat("word " * 1500, max_tokens=1000)
    refused = error(post(server, "/v1/chat/completions", body), 400, "context_length_exceeded")
    assert "2048" in refused["message"]


def test_concurrent_requests_each_get_their_own_answer(server):
    topics = ["the sea", "a city", "old trees", "winter"]
    solo = [answer(server, chat(f"Tell me about {t}."))[0] for t in topics]
    with ThreadPoolExecutor(len(topics)) as pool:
        together = list(pool.map(lambda t: answer(server, chat(f"Tell me about {t}."))[0], topics))
    assert together == solo


def values_of(body: dict, index: int) -> dict[int, float]:
    """Feature `index`'s read value at each position of a response's sae_activations."""
    return {
        p["position"]: next(f["value"] for f in p["features"] if f["index"] == index)
        for p in body["millm"]["sae_activations"]["positions"]
    }


def test_steering_reading_probing_and_operators_through_an_attached_sae(server):
    plain = answer(server, chat("Tell me about the sea."))[0]
    sae = post(server, "/api/saes", {"path": str(server.sae_at[1])}).json()["id"]
    assert post(server, f"/api/saes/{sae}/attach", {}).status_code == 200
    try:
        feature = {"features": [{"sae_id": sae, "index": 3, "strength": 80.0}]}
        assert post(server, "/api/steering/features", feature).status_code == 200
        steered, response = answer(server, chat("Tell me about the sea."))
        assert steered != plain
        assert member(response.headers["x-millm-steering"]) == (
            "manual",
            {
                "sae": sae,
                "layer": 1,
                "features": 1,
                "hash": steering_set_hash(sae, [(3, 80.0)]),
                "version": member(response.headers["x-millm-steering"])[1]["version"],
            },
        )
        # the original miLLM's inline shape steers the GGUF model the same, named as inline
        inline = {"sae_id": sae, "features": [{"index": 3, "strength": 80.0}]}
        same, own = answer(server, chat("Tell me about the sea.", steering=inline))
        assert same == steered and member(own.headers["x-millm-steering"])[0] == "inline"
        assert member(own.headers["x-millm-steering"])[1]["hash"] == steering_set_hash(
            sae, [(3, 80.0)]
        )
        reads = {}
        for point in ("pre_steering", "post_steering"):
            asked = {"features": [3], "positions": "all", "read_point": point}
            probe = {
                "name": "p",
                "detector": {"type": "feature", "sae_id": sae, "index": 3, "threshold": 0.01},
            }
            _, response = answer(server, chat("Hi", return_sae_activations=asked, probes=[probe]))
            reads[point] = response.json()
        before, after = (values_of(reads[p], 3) for p in ("pre_steering", "post_steering"))
        assert before.keys() == after.keys() and len(before) > 20
        moved = sum(abs(after[p] - before[p]) for p in before) / len(before)
        assert moved > 1.0  # the read after the addition sees it (a random SAE: either sign)
        (verdict,) = reads["pre_steering"]["millm"]["probes"]  # a probe watches before the edits
        assert verdict["peak"] == pytest.approx(before[verdict["peak_position"]], abs=1e-4)
        cap = api(
            server, "PUT", f"/api/steering/saes/{sae}/features/5", json={"op": "cap", "value": 1.0}
        )
        assert cap.status_code == 200, cap.text
        capped, _ = answer(server, chat("Tell me about the sea."))
        assert capped  # an operator runs inside llama.cpp's graph too
    finally:
        api(server, "DELETE", "/api/steering/features")
        post(server, f"/api/saes/{sae}/detach", {})
    assert answer(server, chat("Tell me about the sea."))[0] == plain


def test_probes_score_a_transcript_as_the_live_request_did(server):
    sae = post(server, "/api/saes", {"path": str(server.sae_at[1])}).json()["id"]
    assert post(server, f"/api/saes/{sae}/attach", {}).status_code == 200
    try:
        probe = {"name": "p", "detector": {"type": "feature", "sae_id": sae, "index": 3,
                                           "threshold": 0.01}}  # fmt: skip
        asked = {"features": [3], "positions": "all"}
        _, response = answer(server, chat("Hi", return_sae_activations=asked, probes=[probe]))
        live = response.json()
        (verdict,) = live["millm"]["probes"]
        fed = [p["token_id"] for p in live["millm"]["sae_activations"]["positions"]]
        prompt_tokens = live["usage"]["prompt_tokens"]
        body = {"probes": [probe], "inputs": [{"token_ids": fed, "prompt_tokens": prompt_tokens}]}
        scored = post(server, "/api/probes/score", body)
        assert scored.status_code == 200, scored.text
        (offline,) = scored.json()["results"][0]["verdicts"]
        assert (offline["fired"], offline["positions"]) == (verdict["fired"], verdict["positions"])
        assert offline["peak_position"] == verdict["peak_position"]
        assert abs(offline["peak"] - verdict["peak"]) <= 0.001
    finally:
        post(server, f"/api/saes/{sae}/detach", {})


def test_an_sae_on_block_0_steers_here_too(server):
    plain = answer(server, chat("Hi"))[0]
    sae = post(server, "/api/saes", {"path": str(server.sae_at[0])}).json()["id"]
    assert post(server, f"/api/saes/{sae}/attach", {}).status_code == 200
    try:
        steer = {"features": [{"sae_id": sae, "index": 1, "strength": 50.0}]}
        assert post(server, "/api/steering/features", steer).status_code == 200
        assert answer(server, chat("Hi"))[0] != plain
    finally:
        api(server, "DELETE", "/api/steering/features")
        post(server, f"/api/saes/{sae}/detach", {})


def test_quantizations_side_by_side_are_named_repo_quant(server, tiny_gguf):
    assert answer(server, {**chat("Hi"), "model": "tiny-llama"})[0]  # a bare name while one exists
    q8 = tiny_gguf.parent / "tiny-llama.Q8_0.gguf"
    registered = post(server, "/api/models", {"source": str(q8)})
    assert registered.status_code == 201, registered.text
    assert registered.json()["id"] == "tiny-llama:Q8_0"
    # attaching SAEs above locked the server to it
    post(server, "/api/models/tiny-llama:F32/unlock", {})
    listed = {m["id"] for m in api(server, "GET", "/v1/models").json()["data"]}
    assert {"tiny-llama:F32", "tiny-llama:Q8_0"} <= listed
    ambiguous = error(
        post(server, "/v1/chat/completions", {**chat("Hi"), "model": "tiny-llama"}),
        400,
        "AMBIGUOUS_MODEL_NAME",
    )
    assert "F32, Q8_0" in ambiguous["message"] and ambiguous["param"] == "model"
    states = {m["id"]: m["state"] for m in api(server, "GET", "/api/models").json()["data"]}
    assert states["tiny-llama:F32"] == "loaded" and states["tiny-llama:Q8_0"] == "ready"
    try:
        text, response = answer(
            server, {**chat("Tell me about the sea."), "model": "tiny-llama:Q8_0"}
        )
        assert response.json()["model"] == "tiny-llama:Q8_0" and response.json()[
            "system_fingerprint"
        ].endswith("/Q8_0:llama.cpp")
    finally:
        assert post(server, "/api/models/tiny-llama:F32/load", {}).status_code == 200
    assert answer(server, chat("Hi"))[0]


def test_a_variant_scoring_steered_scores_under_its_steering(server, tiny_dirs):
    """Echo's prompt logprobs of a steered-scoring variant on llama.cpp equal transformers' forward
    with the same decoder row hooked in (F32 weights: the same numbers), and a base name's stay
    unsteered."""
    from tests.support.steered_forward import steered_logprobs

    sae = attach_sae(server, server.sae_at[1])
    steering = [{"sae_id": sae, "features": [{"index": 3, "strength": 40.0}]}]
    variant = {
        "name": "cpp-steered",
        "base": MODEL,
        "steering": {"steering": steering},
        "scoring": "steered",
    }
    assert post(server, "/api/variants", variant).status_code == 201
    try:
        prompt = "The capital of France is"
        body = {
            "prompt": prompt,
            "echo": True,
            "logprobs": 0,
            "max_tokens": 0,
            "return_tokens_as_token_ids": True,
        }
        steered = post(server, "/v1/completions", {"model": "cpp-steered", **body}).json()
        plain = post(server, "/v1/completions", {"model": MODEL, **body}).json()
        ids = [int(t.split(":")[1]) for t in steered["choices"][0]["logprobs"]["tokens"]]
        expected = steered_logprobs(tiny_dirs["llama"], server.sae_at[1], ids, 1, 3, 40.0)
        ours = steered["choices"][0]["logprobs"]["token_logprobs"][1:]
        assert ours == pytest.approx(
            [expected[i - 1, ids[i]].item() for i in range(1, len(ids))], abs=1e-3
        )
        assert plain["choices"][0]["logprobs"]["token_logprobs"][1:] != pytest.approx(
            ours, abs=1e-3
        )
    finally:
        api(server, "DELETE", "/api/variants/cpp-steered")
        post(server, f"/api/saes/{sae}/detach", {})


def test_inspect_equals_the_transformers_engine_and_a_calibration_runs(server, llama_lm):
    from dataclasses import replace

    from millm.engine.jobs import ResidualRead, ResidualsRead
    from millm.interp.formats import read_sae
    from tests.integration.engine_helpers import generate, row

    text = "The old ship sailed into the harbour at dawn."
    _, model_sae = read_sae(server.sae_at[1])
    ids = llama_lm.tokenizer(text)["input_ids"]
    read = ResidualRead(1, False, "prompt", "expected", encode=model_sae.encode)
    outcome = generate(llama_lm, [replace(row(ids, 1), reads=(read,))])
    expected = next(e for e in outcome.events if isinstance(e, ResidualsRead)).encoded[1:]
    chosen = int(expected.max(0).values.argmax())
    sae = attach_sae(server, server.sae_at[1])
    try:
        inspected = post(
            server, f"/api/saes/{sae}/inspect", {"text": text, "feature": chosen, "model": MODEL}
        )
        assert inspected.status_code == 200, inspected.text
        values = [v["value"] for v in inspected.json()["activations"]["values"]]
        assert values == pytest.approx(expected[:, chosen].tolist(), abs=1e-4)
        texts = [text, "A river runs through the old town."]
        started = post(server, f"/api/saes/{sae}/calibrate", {"texts": texts})
        assert started.status_code == 202, started.text
        job = finished_job(server, started.json()["id"])
        assert job["state"] == "succeeded", job
        assert job["result"]["tokens"] == sum(
            len(llama_lm.tokenizer(t)["input_ids"]) for t in texts
        )
    finally:
        post(server, f"/api/saes/{sae}/detach", {})


def test_the_logit_lens_reads_each_block_as_transformers_does(server, tiny_dirs):
    """The file's own final norm and head, dequantised, over llama.cpp's block outputs: every
    block's top tokens and probabilities as transformers' hidden states give them (1e-4)."""
    answer = post(server, "/api/lens", {"text": "The capital of France is", "top_k": 3})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    expected = lens_reference(tiny_dirs["llama"], [t["token_id"] for t in body["tokens"]])
    assert body["layers"] == list(range(len(expected)))
    for prediction in body["predictions"]:
        p = prediction["position"]
        final = int(expected[-1][p].argmax())
        assert prediction["final"]["token_id"] == final
        for cell in prediction["layers"]:
            top = expected[cell["layer"]][p].topk(3)
            assert [t["token_id"] for t in cell["top"]] == top.indices.tolist()
            assert [t["probability"] for t in cell["top"]] == pytest.approx(
                top.values.tolist(), abs=1e-4
            )


def test_an_attribution_graph_is_traced_on_a_transformers_copy_of_the_file(server, tiny_dirs):
    """llama.cpp keeps its weights and a graph differentiates them: the graph comes from a
    transformers copy of the same file loaded beside for the request, so its target is the
    logit transformers computes (the F32 file holds the tiny Llama's very weights), the check
    ablates on that copy, and the copy is freed afterwards (a second graph loads it again)."""
    from transformers import AutoModelForCausalLM

    sae = attach_sae(server, server.sae_at[1])
    try:
        for _ in range(2):
            traced = post(
                server,
                "/api/attribution",
                {"text": "The capital of France is", "max_feature_nodes": 32, "verify": 4},
            )
            assert traced.status_code == 200, traced.text
            graph = traced.json()
            ids = [t["token_id"] for t in graph["tokens"]]
            model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype="float32")
            with torch.inference_mode():
                logits = model(torch.tensor([ids])).logits[0, -1].double()
            top = int(logits.argmax())
            assert graph["target"]["token_ids"] == [top]
            assert graph["target"]["value"] == pytest.approx(
                float(logits[top] - logits.mean()), abs=1e-4
            )
            assert any(n["kind"] == "feature" and n["sae_id"] == sae for n in graph["nodes"])
            check = graph["verification"]
            assert check["served_value"] == pytest.approx(graph["target"]["value"], abs=1e-4)
        text, response = answer(server, chat("Tell me about the sea."))
        assert text and response.json()["system_fingerprint"].endswith(":llama.cpp")
    finally:
        post(server, f"/api/saes/{sae}/detach", {})


def test_the_discovery_and_training_jobs_read_on_llamacpp(server):
    positive = ["The cat runs café quickly.", "A river is a café.", "My café is open."]
    negative = ["The cat runs quickly.", "A river is a model.", "My shop is open."]
    sae = attach_sae(server, server.sae_at[1])
    try:
        contrast = post(
            server,
            f"/api/saes/{sae}/contrast",
            {"a": {"texts": positive}, "b": {"texts": negative}, "top_k": 3},
        )
        assert contrast.status_code == 200, contrast.text
        assert contrast.json()["a"]["texts"] == 3 and len(contrast.json()["favouring_a"]) == 3
        pairs = [{"positive": p, "negative": n} for p, n in zip(positive, negative, strict=True)]
        jobs = {
            "/api/vectors/train": {"name": "cafe-cpp", "layer": 1, "pairs": pairs},
            "/api/probes/train": {
                "name": "cafe-cpp",
                "positive": {"texts": positive * 3},
                "negative": {"texts": negative * 3},
                "layer": 1,
                "seed": 7,
            },
            "/api/autosteer": {
                "goal": "paris",  # a word the tiny SAE's labels hold
                "probe_prompts": ["Tell me a story.", "What is new?"],
                "candidates": 2,
                "strengths": [3.0],
                "max_tokens": 4,
            },
        }
        results = {}
        for route, body in jobs.items():
            started = post(server, route, body)
            assert started.status_code == 202, started.text
            job = finished_job(server, started.json()["id"])
            assert job["state"] == "succeeded", json.dumps(job)[-600:]
            results[route] = job["result"]
        vector = results["/api/vectors/train"]
        assert vector["d_model"] == 64 and vector["norm"] > 0 and vector["model"] == MODEL
        assert len(results["/api/autosteer"]["settings"]) == 2
    finally:
        api(server, "DELETE", "/api/vectors/cafe-cpp")
        api(server, "DELETE", "/api/probes/cafe-cpp")
        post(server, f"/api/saes/{sae}/detach", {})


def finished_training(server, training_id: str) -> dict:
    """The training's view once it is no longer running."""
    deadline = time.monotonic() + 240
    while (view := api(server, "GET", f"/api/saes/trainings/{training_id}").json())["state"] == (
        "running"
    ):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    return view


def test_a_dictionary_trains_and_grades_inside_llamacpps_graph(server, tiny_dirs, tmp_path):
    texts = [
        f"The river runs to the sea past mill {i}, and the boats go with it." for i in range(80)
    ]
    body = {
        "name": "cpp-topk", "layer": 1, "d_sae": 128, "k": 8, "training_tokens": 4096,
        "batch_tokens": 256, "lr": 0.01, "corpus": {"texts": texts, "context_size": 32},
        "then": {"attach": True},
    }  # fmt: skip
    started = post(server, "/api/saes/train", body)
    assert started.status_code == 202, started.text
    training_id = started.json()["id"]
    view = finished_training(server, training_id)
    assert view["state"] == "succeeded", view
    trained = view["result"]["sae_id"]
    try:
        assert view["progress"]["curve"][-1]["fve"] > 0.5  # it learned from llama.cpp's reads
        assert view["result"]["grade"]["state"] == "succeeded"
    finally:
        post(server, f"/api/saes/{trained}/detach", {})
    # transcoders re-run the MLPs, which llama.cpp's graph cannot: a transformers copy of the file
    # is read instead, loaded beside the served model for the training's length
    sets = {**body, "kind": "transcoder_set", "layer": None, "then": {}, "name": "tc",
            "training_tokens": 2048}  # fmt: skip
    started = post(server, "/api/saes/train", sets)
    assert started.status_code == 202, started.text
    view = finished_training(server, started.json()["id"])
    assert view["state"] == "succeeded", view
    found = api(server, "GET", f"/api/transcoders/{view['result']['transcoder_set_id']}").json()
    assert found["layers"] == [0, 1, 2]
    assert api(server, "GET", "/api/health/inference").json()["engine"] == "llama.cpp"

    # a transcoder's grade (on the copy) equals the float64 reference of the same weights
    from tests.support.tiny_transcoders import build_transcoder_set

    block_file = build_transcoder_set(tmp_path / "set", seed=7, skip=True) / "layer_1.safetensors"
    transcoder = attach_sae(server, block_file)
    try:
        corpus = {"texts": texts[:4], "context_size": 1024}
        started = post(server, f"/api/saes/{transcoder}/grade", {"corpus": corpus})
        assert started.status_code == 202, started.text
        figures = finished_job(server, started.json()["id"])["result"]["figures"]
    finally:
        post(server, f"/api/saes/{transcoder}/detach", {})
    ids = [post(server, "/tokenize", {"prompt": t}).json()["tokens"] for t in texts[:4]]
    expected = transcoder_reference(tiny_dirs["llama"], block_file, 1, ids)
    expected.pop("tokens")
    for name, value in expected.items():
        assert figures[name] == pytest.approx(value, rel=1e-3, abs=1e-4), name

    # a grade spliced into llama.cpp's graph equals the float64 reference of the same weights
    sae_dir = build_saelens(tmp_path / "graded", layer=1, seed=5, architecture="standard")
    sae = attach_sae(server, sae_dir)
    try:
        corpus = {"texts": texts[:4], "context_size": 1024}
        started = post(server, f"/api/saes/{sae}/grade", {"corpus": corpus})
        assert started.status_code == 202, started.text
        figures = finished_job(server, started.json()["id"])["result"]["figures"]
        # the file's own tokenizer, as the grade read the texts
        ids = [post(server, "/tokenize", {"prompt": t}).json()["tokens"] for t in texts[:4]]
        expected = reference(tiny_dirs["llama"], sae_dir, ids)
        expected.pop("tokens")
        for name, value in expected.items():
            assert figures[name] == pytest.approx(value, rel=1e-3, abs=1e-4), name
    finally:
        post(server, f"/api/saes/{sae}/detach", {})
