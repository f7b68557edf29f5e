"""A transcoder file as an SAE on a live server (tiny Llama, a random transcoder set): registered
by its path, attached at its block, its features read at the MLP's input, steered (add, clamp,
ablate) into the residual after the block, calibrated and searched by label exactly as a stock
transformers model with hooks computes them; all three blocks attached give the set's graph."""

from __future__ import annotations

import pytest
import torch

from millm.interp.formats import read_sae
from tests.api.clients import MODEL, api, error, post
from tests.api.test_calibration_api import wait_job
from tests.support.server import ServerProcess
from tests.support.tiny_transcoders import build_transcoder_set

BLOCK = 1
PROMPT = "The old river runs to the sea"


@pytest.fixture(scope="module")
def set_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("tc-set")
    return build_transcoder_set(base / "set", seed=31, labels=True)


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory, set_dir):
    process = ServerProcess(
        tmp_path_factory.mktemp("tc-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        process.wait_ready()
        process.ids = {}
        for block in range(3):
            path = set_dir / f"layer_{block}.safetensors"
            registered = post(process, "/api/saes", {"path": str(path)})
            assert registered.status_code in (200, 201), registered.text
            process.ids[block] = registered.json()["id"]
        assert post(process, f"/api/saes/{process.ids[BLOCK]}/attach", {}).status_code == 200
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def offline(tiny_dirs, set_dir):
    """A stock transformers model; `run(ids, write)` returns (the block's MLP input `[T, d]`, the
    logits `[T, V]`) with `write(mlp_input, mlp_output)` replacing the block's MLP output."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    layer = model.model.layers[BLOCK]
    state: dict = {}

    def mlp_hook(module, args, output):
        state["input"] = args[0][0].clone()
        write = state.get("write")
        return output if write is None else write(args[0], output)

    layer.mlp.register_forward_hook(mlp_hook)

    def run(ids: list[int], write=None) -> tuple[torch.Tensor, torch.Tensor]:
        state["write"] = write
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        return state["input"], logits

    return run


@pytest.fixture(scope="module")
def transcoder(set_dir):
    return read_sae(set_dir / f"layer_{BLOCK}.safetensors")[1]


def completion(server, steering=None, **extra) -> dict:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, **extra}
    if steering is not None:
        body["steering"] = {"steering": [{"sae_id": server.ids[BLOCK], "features": steering}]}
    response = post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_transcoder_file_registers_as_an_sae_hooked_at_its_blocks_mlp(server, set_dir):
    info = api(server, "GET", f"/api/saes/{server.ids[BLOCK]}").json()
    assert info["format"] == "transcoder" and info["hook_point"] == "mlp"
    assert info["layer"] == BLOCK and info["hook_name"] == f"blocks.{BLOCK}.mlp.hook_in"
    assert (info["d_in"], info["d_sae"], info["architecture"]) == (64, 48, "jumprelu")
    assert info["has_labels"] is True
    # Its labels (the file beside it) are searchable like any SAE's.
    found = api(server, "GET", f"/api/saes/{server.ids[BLOCK]}/features", params={"q": "#7"})
    assert found.status_code == 200, found.text
    assert f"block {BLOCK} #7" in [f["label"] for f in found.json()["data"]]
    # A file that is not one of its set's transcoders is refused with the reason.
    stray = set_dir / "extra.safetensors"
    stray.write_bytes((set_dir / "layer_0.safetensors").read_bytes())
    refused = post(server, "/api/saes", {"path": str(stray)})
    assert "extra.safetensors is not one of the transcoders" in error(refused, 400)["message"]


def test_reads_are_the_transcoders_encode_of_the_mlp_input(server, offline, transcoder):
    answer = completion(
        server,
        return_sae_activations={"sae_id": server.ids[BLOCK], "positions": "all", "top_k": 5},
    )
    block = answer["millm"]["sae_activations"]
    assert block["layer"] == BLOCK
    ids = [p["token_id"] for p in block["positions"]]
    mlp_input, _ = offline(ids)
    reference = transcoder.encode(mlp_input)
    fired = 0
    for entry in block["positions"]:
        top = torch.topk(reference[entry["position"]], 5)
        want = [(int(i), float(v)) for v, i in zip(top.values, top.indices, strict=True) if v > 0]
        got = [(f["index"], f["value"]) for f in entry["features"]]
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-4, abs=1e-4)
        fired += len(got)
    assert fired > 0


def busiest(transcoder, offline, ids) -> int:
    """The feature firing at the most prompt positions (what a clamp and an ablation move)."""
    mlp_input, _ = offline(ids)
    return int((transcoder.encode(mlp_input) > 0).sum(0).argmax())


def drawn(answer: dict) -> tuple[list[int], list[float]]:
    """The drawn token ids and their log-probabilities."""
    logprobs = answer["choices"][0]["logprobs"]
    ids = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    return ids, logprobs["token_logprobs"]


@pytest.mark.parametrize("op", ["add", "clamp", "ablate"])
def test_steering_writes_into_the_mlp_output_as_the_reference_does(server, offline, transcoder, op):
    prompt = api(server, "POST", "/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    prompt_ids = prompt["tokens"]
    feature = busiest(transcoder, offline, prompt_ids)
    spec = {
        "add": {"index": feature, "strength": 8.0},
        "clamp": {"index": feature, "op": "clamp", "value": 3.0},
        "ablate": {"index": feature, "op": "ablate"},
    }[op]
    ids, values = drawn(
        completion(server, steering=[spec], logprobs=1, return_tokens_as_token_ids=True)
    )
    row = transcoder.W_dec[feature]

    def write(mlp_input, output):
        if op == "add":
            return output + 8.0 * row
        now = transcoder.encode(mlp_input[0])[:, feature]
        target = torch.zeros_like(now) if op == "ablate" else torch.full_like(now, 3.0)
        return output + ((target - now)[:, None] * row)[None]

    _, logits = offline([*prompt_ids, *ids], write)
    logprobs = torch.log_softmax(logits, -1)
    start = len(prompt_ids) - 1
    for step, (token, value) in enumerate(zip(ids, values, strict=True)):
        assert int(logprobs[start + step].argmax()) == token
        assert value == pytest.approx(float(logprobs[start + step, token]), abs=1e-4)
    _, unsteered = drawn(completion(server, logprobs=1, return_tokens_as_token_ids=True))
    assert max(abs(a - b) for a, b in zip(unsteered, values, strict=True)) > 1e-3


def test_a_calibration_reads_the_mlp_input(server, offline, transcoder):
    texts = [PROMPT, "A small cat is the city of France.", "Sparse codes count one two three"]
    started = post(server, f"/api/saes/{server.ids[BLOCK]}/calibrate", {"texts": texts})
    assert started.status_code == 202, started.text
    job = wait_job(server, started.json()["id"])
    assert job["state"] == "succeeded", job
    dense = []
    for text in texts:
        ids = api(server, "POST", "/tokenize", json={"model": MODEL, "prompt": text}).json()
        mlp_input, _ = offline(ids["tokens"])
        dense.append(transcoder.encode(mlp_input)[1:])  # position 0 is never read
    column_max = torch.cat(dense).max(0).values
    figures = api(
        server,
        "GET",
        f"/api/saes/{server.ids[BLOCK]}/calibration",
        params={"features": ",".join(map(str, range(48)))},
    ).json()["features"]
    assert [f["max"] for f in figures] == pytest.approx(column_max.tolist(), rel=1e-4, abs=1e-5)
    assert sum(f["count"] > 0 for f in figures) > 10


def test_every_block_attached_gives_the_sets_own_graph(server, set_dir):
    for block in (0, 2):
        assert post(server, f"/api/saes/{server.ids[block]}/attach", {}).status_code == 200
    try:
        registered = post(server, "/api/transcoders", {"path": str(set_dir)}).json()
        body = {"text": PROMPT, "max_feature_nodes": 64, "verify": 0}
        by_set = post(server, "/api/attribution", {**body, "transcoders": registered["id"]})
        by_saes = post(server, "/api/attribution", {**body, "saes": list(server.ids.values())})
        assert by_set.status_code == by_saes.status_code == 200, (by_set.text, by_saes.text)
        one, two = by_set.json(), by_saes.json()
        assert one["method"] == two["method"] == "transcoders"
        assert two["target"]["value"] == pytest.approx(one["target"]["value"], abs=1e-5)

        def edges(graph):
            return {(e["source"], e["target"]): e["weight"] for e in graph["edges"]}

        assert edges(one) and edges(one).keys() == edges(two).keys()
        for key, weight in edges(one).items():
            assert edges(two)[key] == pytest.approx(weight, abs=1e-5)
    finally:
        for block in (0, 2):
            post(server, f"/api/saes/{server.ids[block]}/detach", {})


def test_a_probe_cannot_read_where_a_transcoder_reads(server):
    body = {
        "name": "tc-probe",
        "sae_id": server.ids[BLOCK],
        "positive": {"texts": ["a river", "the sea", "a boat", "the shore"]},
        "negative": {"texts": ["a cat", "the dog", "a desk", "the office"]},
    }
    refused = post(server, "/api/probes/train", body)
    assert "is a transcoder" in error(refused, 400)["message"]
    assert error(refused, 400)["param"] == "sae_id"


def test_a_graph_steered_by_a_transcoder_clamp_is_the_clamped_models(server, offline, transcoder):
    """The replacement pass applies the clamp as the served model does: its target is the
    logit difference of the stock model whose MLP output the hook rewrites."""
    prompt_ids = api(server, "POST", "/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    feature = busiest(transcoder, offline, prompt_ids["tokens"])
    profile = {
        "name": "tc-clamp",
        "steering": [
            {
                "sae_id": server.ids[BLOCK],
                "features": [{"index": feature, "op": "clamp", "value": 3.0}],
            }
        ],
    }
    assert post(server, "/api/profiles", profile).status_code == 201
    steering = {"profile": "tc-clamp"}
    asked = {"text": PROMPT, "target": {"token": 5, "versus": 6}, "max_feature_nodes": 8}
    answer = post(server, "/api/attribution", {**asked, "verify": 2, "steering": steering})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    row = transcoder.W_dec[feature]

    def clamp(mlp_input, output):
        now = transcoder.encode(mlp_input[0])[:, feature]
        return output + ((3.0 - now)[:, None] * row)[None]

    ids = [t["token_id"] for t in body["tokens"]]
    _, clean = offline(ids)
    _, clamped = offline(ids, clamp)
    want = float(clamped[-1, 5] - clamped[-1, 6])
    assert body["steered"] is True
    assert body["target"]["value"] == pytest.approx(want, abs=1e-4)
    assert body["verification"]["served_value"] == pytest.approx(want, abs=1e-4)
    assert abs(want - float(clean[-1, 5] - clean[-1, 6])) > 1e-3


@pytest.mark.parametrize("op", ["add", "clamp", "ablate"])
def test_a_cross_layer_block_steers_every_block_it_writes_into(server, tiny_dirs, op):
    """Block 1 of a CLT on the 3-block model writes into blocks 1 and 2: add, clamp and ablate
    give a stock model's log-probabilities with both MLP outputs rewritten by hooks."""
    from transformers import AutoModelForCausalLM

    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_clt

    directory = build_clt(TEST_ROOT / "clt-steer", seed=21)
    sae_id = post(server, "/api/saes", {"path": str(directory / "W_enc_1.safetensors")}).json()[
        "id"
    ]
    assert post(server, f"/api/saes/{sae_id}/attach", {}).status_code == 200
    try:
        block = read_sae(directory / "W_enc_1.safetensors")[1]
        prompt_ids = api(
            server, "POST", "/tokenize", json={"model": MODEL, "prompt": PROMPT}
        ).json()
        model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32)
        layers = model.eval().model.layers
        state: dict = {}

        def read(module, args, output):
            state["acts"] = block.encode(args[0][0])

        layers[1].mlp.register_forward_hook(read)
        with torch.no_grad():
            model(torch.tensor([prompt_ids["tokens"]]))
        feature = int((state["acts"] > 0).sum(0).argmax())
        spec = {
            "add": {"index": feature, "strength": 8.0},
            "clamp": {"index": feature, "op": "clamp", "value": 3.0},
            "ablate": {"index": feature, "op": "ablate"},
        }[op]
        body = {
            "model": MODEL,
            "prompt": PROMPT,
            "max_tokens": 3,
            "temperature": 0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "steering": {"steering": [{"sae_id": sae_id, "features": [spec]}]},
        }
        answer = post(server, "/v1/completions", body)
        assert answer.status_code == 200, answer.text
        ids, values = drawn(answer.json())

        def writer(k):
            def write(module, args, output):
                now = state["acts"][:, feature]
                if op == "add":
                    push = torch.full_like(now, 8.0)
                else:
                    push = (0.0 if op == "ablate" else 3.0) - now
                return output + (push[:, None] * block.cross[feature, k])[None]

            return write

        for k in range(2):  # block 1 (the read's own hook runs first) and block 2
            layers[1 + k].mlp.register_forward_hook(writer(k))
        with torch.no_grad():
            logits = model(torch.tensor([[*prompt_ids["tokens"], *ids]])).logits[0]
        logprobs = torch.log_softmax(logits, -1)
        start = len(prompt_ids["tokens"]) - 1
        for step, (token, value) in enumerate(zip(ids, values, strict=True)):
            assert int(logprobs[start + step].argmax()) == token
            assert value == pytest.approx(float(logprobs[start + step, token]), abs=1e-4)
        capped = {
            **body,
            "steering": {
                "steering": [
                    {"sae_id": sae_id, "features": [{"index": feature, "op": "cap", "value": 1.0}]}
                ]
            },
        }
        assert (
            error(post(server, "/v1/completions", capped), 400)["code"] == "operator_not_applicable"
        )
    finally:
        post(server, f"/api/saes/{sae_id}/detach", {})


def test_a_feature_probe_on_a_transcoder_watches_the_mlp_input(server, offline, transcoder):
    prompt_ids = api(server, "POST", "/tokenize", json={"model": MODEL, "prompt": PROMPT}).json()
    feature = busiest(transcoder, offline, prompt_ids["tokens"])
    detector = {"type": "feature", "sae_id": server.ids[BLOCK], "index": feature, "threshold": 0.01}
    answer = completion(
        server,
        logprobs=1,
        return_tokens_as_token_ids=True,
        probes=[{"name": "tc", "detector": detector}],
    )
    (entry,) = answer["millm"]["probes"]
    ids, _ = drawn(answer)
    fed = [*prompt_ids["tokens"], *ids[:-1]]  # the last drawn token is never fed
    mlp_input, _ = offline(fed)
    scores = transcoder.encode(mlp_input)[:, feature]
    assert entry["peak"] == pytest.approx(float(scores[1:].max()), rel=1e-4, abs=1e-5)
