"""POST /api/attribution (issue 35) on a live server: the tiny Llama with a SAELens TopK SAE after
block 1. The graph's target is the served model's own (its value the demeaned logit transformers
computes), every edge joins listed nodes, the ablation check reports numbers the served model
measured, the graph is kept and exported in circuit-tracer's JSON, and bad input is a 400 that
names its field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.api.clients import api, error, llama_with_sae, post

TEXT = "The capital of France is"


@pytest.fixture(scope="module")
def server(tiny_dirs, tmp_path_factory):
    with llama_with_sae(tiny_dirs, tmp_path_factory.mktemp("attribution"), seed=7) as process:
        yield process


@pytest.fixture(scope="module")
def graph(server) -> dict:
    answer = post(server, "/api/attribution", {"text": TEXT, "max_feature_nodes": 64, "verify": 6})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_target_is_the_models_own_prediction_and_its_demeaned_logit(graph, tiny_dirs):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32)
    ids = [t["token_id"] for t in graph["tokens"]]
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    top = int(logits.argmax())
    target = graph["target"]
    assert target["token_ids"] == [top] and target["coefficients"] == [1.0]
    assert target["value"] == pytest.approx(float(logits[top] - logits.mean()), abs=1e-4)
    assert target["probability"] == pytest.approx(float(torch.softmax(logits, -1)[top]), abs=1e-4)
    assert graph["method"] == "attribution patching" and graph["steered"] is False
    assert graph["verification"]["served_value"] == pytest.approx(target["value"], abs=1e-4)


def test_nodes_and_edges_form_one_pruned_graph(graph, server):
    nodes = {n["id"]: n for n in graph["nodes"]}
    kinds = {n["kind"] for n in graph["nodes"]}
    assert {"feature", "token", "target"} <= kinds
    assert sum(n["kind"] == "token" for n in graph["nodes"]) == len(graph["tokens"])
    for edge in graph["edges"]:
        assert edge["source"] in nodes and edge["target"] in nodes and edge["weight"] != 0
    target = next(n for n in graph["nodes"] if n["kind"] == "target")
    assert any(e["target"] == target["id"] for e in graph["edges"])
    for node in graph["nodes"]:
        if node["kind"] == "feature":
            assert node["sae_id"] == server.sae and node["layer"] == 1
            assert node["id"] == f"1_{node['feature']}_{node['position']}"
            assert node["activation"] > 0
    assert [s["sae_id"] for s in graph["sources"]] == [server.sae]
    assert 0 < graph["replacement_score"] <= 1 and 0 < graph["completeness_score"] <= 1


def test_the_check_ablates_the_top_features(graph):
    check = graph["verification"]
    assert 1 <= len(check["nodes"]) <= 6 and check["method"] == "ablation"
    for node in check["nodes"]:
        assert node["measured"] != 0 and node["predicted"] != 0
    assert check["passed"] == (check["correlation"] is not None and check["correlation"] >= 0.7)


def test_a_graph_is_kept_and_exports_as_circuit_tracer_writes_it(graph, server):
    again = api(server, "GET", f"/api/attribution/{graph['id']}")
    assert again.status_code == 200 and again.json() == graph
    exported = api(server, "GET", f"/api/attribution/{graph['id']}/export").json()
    assert set(exported) == {"metadata", "qParams", "nodes", "links"}
    assert exported["metadata"]["slug"] == graph["id"]
    assert exported["metadata"]["prompt_tokens"] == [t["token"] for t in graph["tokens"]]
    ids = {n["node_id"] for n in exported["nodes"]}
    assert all(link["source"] in ids and link["target"] in ids for link in exported["links"])
    targets = [n for n in exported["nodes"] if n["is_target_logit"]]
    assert len(targets) == 1 and targets[0]["feature_type"] == "logit"
    assert {n["feature_type"] for n in exported["nodes"]} >= {"embedding", "cross layer transcoder"}
    error(api(server, "GET", "/api/attribution/graph-nope"), 404, "graph_not_found")


def test_a_logit_difference_target_and_a_steered_graph(server, tiny_dirs):
    """The steered graph's target is the steered model's logit difference: the replacement pass
    applies the steering as the served model does (transformers with the same vector added)."""
    steering = {"features": [{"sae_id": server.sae, "index": 3, "strength": 8.0}]}
    asked = {"text": TEXT, "target": {"token": 5, "versus": 6}, "max_feature_nodes": 8}
    answer = post(server, "/api/attribution", {**asked, "verify": 2, "steering": steering})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["target"]["token_ids"] == [5, 6] and body["target"]["coefficients"] == [1.0, -1.0]
    assert body["steered"] is True and body["expanded_features"] <= 8
    plain = post(server, "/api/attribution", {**asked, "verify": 0}).json()
    assert plain["steered"] is False and plain["verification"] is None

    from safetensors.torch import load_file

    direction = 8.0 * load_file(str(server.sae_dir / "sae_weights.safetensors"))["W_dec"][3]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["llama"]), dtype=torch.float32)
    ids = torch.tensor([[t["token_id"] for t in body["tokens"]]])

    def push(module, args, output):
        return (
            (output[0] + direction, *output[1:])
            if isinstance(output, tuple)
            else output + direction
        )

    with torch.inference_mode():
        clean = model(ids).logits[0, -1].double()
        handle = model.model.layers[1].register_forward_hook(push)
        steered = model(ids).logits[0, -1].double()
        handle.remove()
    assert plain["target"]["value"] == pytest.approx(float(clean[5] - clean[6]), abs=1e-4)
    assert body["target"]["value"] == pytest.approx(float(steered[5] - steered[6]), abs=1e-4)
    assert body["verification"]["served_value"] == pytest.approx(body["target"]["value"], abs=1e-4)
    assert abs(body["target"]["value"] - plain["target"]["value"]) > 1e-3


@pytest.mark.parametrize(
    "body, param",
    [
        ({"target": {"token": 10**7}}, "target.token"),
        ({"target": {"token": "the capital"}}, "target.token"),
        ({"target": {"token": 5, "versus": 5}}, "target.versus"),
        ({"saes": ["nope"]}, "saes[0]"),
        ({"max_feature_nodes": 100_000}, "max_feature_nodes"),
        ({"messages": [{"role": "user", "content": "hi"}]}, None),
        ({"node_threshold": 0}, "node_threshold"),
    ],
)
def test_bad_input_is_a_400_naming_its_field(server, body, param):
    found = error(post(server, "/api/attribution", {"text": TEXT, **body}), 400)
    if param is not None:
        assert found["param"] == param, found


def test_an_export_imports_back_as_the_same_graph(graph, server):
    exported = api(server, "GET", f"/api/attribution/{graph['id']}/export").json()
    answer = post(server, "/api/attribution/import", exported)
    assert answer.status_code == 200, answer.text
    imported = answer.json()
    assert imported["method"] == "imported" and imported["id"] != graph["id"]
    assert imported["replacement_score"] is None and imported["verification"] is None
    assert imported["tokens"] == graph["tokens"]
    assert imported["target"]["token_ids"] == graph["target"]["token_ids"]
    assert imported["target"]["tokens"] == graph["target"]["tokens"]

    def shape(g):
        return {
            n["id"]: (n["kind"], n["layer"], n["position"], n["feature"], n["label"])
            for n in g["nodes"]
        }

    assert shape(imported) == shape(graph)
    assert imported["edges"] == graph["edges"]
    assert api(server, "GET", f"/api/attribution/{imported['id']}").json() == imported


def test_a_broken_graph_file_is_a_400_naming_the_link(graph, server):
    exported = api(server, "GET", f"/api/attribution/{graph['id']}/export").json()
    exported["links"][0]["source"] = "nowhere"
    found = error(post(server, "/api/attribution/import", exported), 400)
    assert found["param"] == "links[0].source"


def test_chosen_feature_nodes_become_a_profile(graph, server):
    features = [n for n in graph["nodes"] if n["kind"] == "feature"][:3]
    answer = post(
        server,
        f"/api/attribution/{graph['id']}/profile",
        {"name": "graph-path", "nodes": [n["id"] for n in features]},
    )
    assert answer.status_code == 201, answer.text
    stored = api(server, "GET", "/api/profiles/graph-path").json()
    (entry,) = stored["document"]["steering"]
    assert entry["sae_id"] == server.sae
    assert sorted(f["index"] for f in entry["features"]) == sorted({n["feature"] for n in features})
    assert {f["op"] for f in entry["features"]} == {"ablate"}
    token = next(n for n in graph["nodes"] if n["kind"] == "token")
    for body, param in (
        ({"name": "x", "nodes": [token["id"]]}, "nodes[0]"),
        ({"name": "x", "nodes": ["9_9_9"]}, "nodes[0]"),
        ({"name": "x", "nodes": [features[0]["id"]], "op": "add"}, None),
    ):
        found = error(post(server, f"/api/attribution/{graph['id']}/profile", body), 400)
        if param:
            assert found["param"] == param
    api(server, "DELETE", "/api/profiles/graph-path")


def test_chosen_feature_nodes_become_a_mistudio_circuit(graph, server):
    features = [n for n in graph["nodes"] if n["kind"] == "feature"][:2]
    answer = post(
        server,
        f"/api/attribution/{graph['id']}/circuit",
        {"name": "graph-circuit", "nodes": [n["id"] for n in features], "strength": 12.0},
    )
    assert answer.status_code == 201, answer.text
    exported = api(server, "GET", "/api/circuits/graph-circuit/export").json()
    assert exported["kind"] == "mistudio.circuit-definition"
    assert exported["saes"] == [
        {"mistudio_sae_id": server.sae, "layer": 1, "hook_type": "resid_post"}
    ]
    members = {(m["layer"], m["feature"]["feature_idx"]) for m in exported["members"]}
    assert members == {(1, n["feature"]) for n in features}
    assert all(m["feature"]["strength"] == 12.0 for m in exported["members"])
    assert exported["provenance"]["source_note"] == f"millm attribution graph {graph['id']}"
    taken = post(
        server,
        f"/api/attribution/{graph['id']}/circuit",
        {"name": "graph-circuit", "nodes": [features[0]["id"]], "strength": 1.0},
    )
    error(taken, 409)
    error(
        post(
            server,
            f"/api/attribution/{graph['id']}/circuit",
            {"name": "c2", "nodes": [features[0]["id"]], "strength": 400.0},
        ),
        400,
    )
    api(server, "DELETE", "/api/circuits/graph-circuit")


def test_a_transcoder_set_gives_the_exact_graph_the_tracer_computes(server, tiny_dirs, llama_lm):
    """circuit-tracer's published setting: a transcoder on every block. The server's graph is the
    in-process tracer's on the same files and weights (edge for edge), with method transcoders."""
    from millm.interp.attribution.graph import Budget, Target, Tracer
    from millm.interp.attribution.replacement import ReplacementModel, Source, plain_source
    from millm.interp.transcoders import read_transcoder_set
    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_transcoder_set

    directory = build_transcoder_set(TEST_ROOT / "transcoders-api", seed=11, labels=True)
    registered = post(server, "/api/transcoders", {"path": str(directory)})
    assert registered.status_code == 201, registered.text
    found = registered.json()
    assert found["layers"] == [0, 1, 2] and found["architecture"] == "jumprelu"
    listed = api(server, "GET", "/api/transcoders").json()["data"]
    assert [s["id"] for s in listed] == [found["id"]]
    answer = post(
        server,
        "/api/attribution",
        {"text": TEXT, "transcoders": found["id"], "max_feature_nodes": 500, "verify": 4},
    )
    assert answer.status_code == 200, answer.text
    graph = answer.json()
    assert graph["method"] == "transcoders" and graph["verification"] is not None
    assert [s["site"] for s in graph["sources"]] == ["mlp", "mlp", "mlp"]

    ids = [t["token_id"] for t in graph["tokens"]]
    model = ReplacementModel(llama_lm.runner.layout)
    sets = read_transcoder_set(directory)
    sources = [
        plain_source(Source(f"{found['id']}/{layer}", sae, layer, "mlp"), torch.float32)
        for layer, sae in sets.layers.items()
    ]
    tracer = Tracer(
        model, ids, sources, Target(tuple(graph["target"]["token_ids"]), (1.0,)), Budget(500)
    )
    tracer.start()
    while tracer.expand():
        pass
    mine = tracer.finish()
    assert mine.method == "transcoders"
    assert graph["target"]["value"] == pytest.approx(mine.target_value, abs=1e-4)
    from millm.lab.attribution.answer import node_ids

    index = {node: i for i, node in enumerate(node_ids(mine, 3))}
    assert graph["edges"]
    for edge in graph["edges"]:
        want = float(mine.adjacency[index[edge["target"]], index[edge["source"]]])
        assert edge["weight"] == pytest.approx(want, abs=1e-4), (
            edge,
            len(mine.features),
            graph["expanded_features"],
        )
    features = [n for n in graph["nodes"] if n["kind"] == "feature"]
    # the labels beside each transcoder file
    assert features and all(n["label"] == f"block {n['layer']} #{n['feature']}" for n in features)
    feature = features[0]
    # A profile of a set's feature names its block's file, registered as an SAE on the way.
    made = post(
        server, f"/api/attribution/{graph['id']}/profile", {"name": "tc", "nodes": [feature["id"]]}
    )
    assert made.status_code == 201, made.text
    (entry,) = made.json()["document"]["steering"]
    block_file = directory / f"layer_{feature['layer']}.safetensors"
    registered_sae = api(server, "GET", f"/api/saes/{entry['sae_id']}").json()
    assert registered_sae["path"] == str(block_file.resolve())
    assert registered_sae["format"] == "transcoder"
    assert entry["features"] == [{"index": feature["feature"], "op": "ablate"}]
    assert found["files"] == [
        str((directory / f"layer_{i}.safetensors").resolve()) for i in range(3)
    ]
    assert api(server, "DELETE", f"/api/transcoders/{found['id']}").json()["deleted"] is True
    gone = post(server, "/api/attribution", {"text": TEXT, "transcoders": found["id"]})
    assert error(gone, 404, "transcoder_set_not_found")["param"] == "transcoders"


def test_a_transcoder_set_outside_the_allowed_paths_is_refused(server, tmp_path_factory):
    from tests.support.tiny_transcoders import build_transcoder_set

    outside = build_transcoder_set(Path("/tmp") / f"outside-{tmp_path_factory.getbasetemp().name}")
    error(post(server, "/api/transcoders", {"path": str(outside)}), 403, "path_not_allowed")
    # another model's width
    wide = build_transcoder_set(tmp_path_factory.mktemp("wide-tc"), d_model=32)
    assert error(post(server, "/api/transcoders", {"path": str(wide)}), 400)["param"] == "path"


def test_a_registered_set_is_kept_across_restarts_and_refused_by_name_once_its_files_go(
    tiny_dirs, tmp_path
):
    """The store remembers where a set lies; the files are read again at start. A set whose files
    went is still listed, with the reason, refused by name (409) until it is deleted."""
    from tests.support.server import TEST_ROOT, ServerProcess
    from tests.support.tiny_transcoders import build_transcoder_set

    directory = build_transcoder_set(TEST_ROOT / f"transcoders-kept-{tmp_path.name}", seed=12)
    home = tmp_path / "home"

    def started() -> ServerProcess:
        process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])])
        process.wait_ready()
        return process

    process = started()
    try:
        first = post(process, "/api/transcoders", {"path": str(directory)})
        assert first.status_code == 201, first.text
        again = post(process, "/api/transcoders", {"path": str(directory)})
        assert again.json()["id"] == first.json()["id"]  # registering again is one set
        set_id = first.json()["id"]
    finally:
        process.stop()
    process = started()
    try:
        listed = api(process, "GET", "/api/transcoders").json()["data"]
        assert [(s["id"], s["layers"]) for s in listed] == [(set_id, [0, 1, 2])]
        body = {"text": TEXT, "transcoders": set_id, "max_feature_nodes": 32, "verify": 0}
        graph = post(process, "/api/attribution", body)
        assert graph.status_code == 200, graph.text
        assert graph.json()["method"] == "transcoders"
    finally:
        process.stop()
    (directory / "layer_1.safetensors").unlink()
    process = started()
    try:
        (listed,) = api(process, "GET", "/api/transcoders").json()["data"]
        assert listed["id"] == set_id and "layer_1.safetensors" in listed["error"]
        refused = post(process, "/api/attribution", body)
        assert "layer_1.safetensors" in error(refused, 409, "transcoder_set_unreadable")["message"]
        assert error(refused, 409)["param"] == "transcoders"
        assert api(process, "DELETE", f"/api/transcoders/{set_id}").json()["deleted"] is True
        assert api(process, "GET", "/api/transcoders").json()["data"] == []
        gone = api(process, "GET", f"/api/transcoders/{set_id}")  # none registered at all
        assert error(gone, 404, "transcoder_set_not_found")["param"] == "set_id"
    finally:
        process.stop()


@pytest.mark.parametrize("layout", ["circuit-tracer", "gemma-scope-2"])
def test_a_cross_layer_transcoder_gives_an_exact_checked_graph(server, layout):
    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_clt, build_gemma_scope_2_clt

    build = build_clt if layout == "circuit-tracer" else build_gemma_scope_2_clt
    directory = build(TEST_ROOT / f"clt-api-{layout}", seed=13)
    registered = post(server, "/api/transcoders", {"path": str(directory)})
    assert registered.status_code == 201, registered.text
    found = registered.json()
    assert found["kind"] == "cross_layer_transcoder" and found["layers"] == [0, 1, 2]
    answer = post(
        server,
        "/api/attribution",
        {"text": TEXT, "transcoders": found["id"], "max_feature_nodes": 64, "verify": 4},
    )
    assert answer.status_code == 200, answer.text
    graph = answer.json()
    assert graph["method"] == "transcoders" and [s["site"] for s in graph["sources"]] == ["mlp"] * 3
    check = graph["verification"]
    assert check["served_value"] == pytest.approx(graph["target"]["value"], abs=1e-4)
    # The linearised model is exact here: each ablation moves the served target by what the
    # graph predicts for it, to first order (the tiny features' writes are small).
    assert len(check["nodes"]) == 4 and check["passed"] is True
    # A profile of its feature names the block's encoder file, registered as an SAE on the way.
    feature = next(n for n in graph["nodes"] if n["kind"] == "feature")
    made = post(
        server, f"/api/attribution/{graph['id']}/profile", {"name": "clt", "nodes": [feature["id"]]}
    )
    assert made.status_code == 201, made.text
    (entry,) = made.json()["document"]["steering"]
    block_sae = api(server, "GET", f"/api/saes/{entry['sae_id']}").json()
    assert block_sae["path"] == found["files"][feature["layer"]]
    # One block of a CLT attached alone is no graph source: its writes land in blocks without one.
    if feature["layer"] < 2:
        assert post(server, f"/api/saes/{entry['sae_id']}/attach", {}).status_code == 200
        try:
            alone = post(server, "/api/attribution", {"text": TEXT, "saes": [entry["sae_id"]]})
            assert "attach its blocks" in error(alone, 400)["message"]
        finally:
            post(server, f"/api/saes/{entry['sae_id']}/detach", {})
    api(server, "DELETE", "/api/profiles/clt")
    assert api(server, "DELETE", f"/api/transcoders/{found['id']}").json()["deleted"] is True


def test_integrated_gradients_give_the_tracers_graph_and_are_refused_where_exact(server, llama_lm):
    """`integrated_gradients` through the server is the in-process tracer's graph with as many
    steps on the same SAE and weights (edge for edge), checked like any graph; out of range, or on
    a transcoder set on every block (linear between nodes: nothing to integrate), it is a 400
    naming the field."""
    from millm.interp.attribution.graph import INTEGRATED, Budget, Target, Tracer
    from millm.interp.attribution.replacement import ReplacementModel, Source, plain_source
    from millm.interp.formats import read_saelens
    from millm.lab.attribution.answer import node_ids
    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_transcoder_set

    body = {"text": TEXT, "max_feature_nodes": 48, "integrated_gradients": 6, "verify": 4}
    answer = post(server, "/api/attribution", body)
    assert answer.status_code == 200, answer.text
    graph = answer.json()
    assert graph["method"] == INTEGRATED == "integrated gradients"
    assert len(graph["verification"]["nodes"]) == 4

    ids = [t["token_id"] for t in graph["tokens"]]
    _, sae = read_saelens(server.sae_dir)
    model = ReplacementModel(llama_lm.runner.layout)
    source = plain_source(Source(server.sae, sae, 1, "resid"), torch.float32)
    target = Target(tuple(graph["target"]["token_ids"]), (1.0,))
    tracer = Tracer(model, ids, [source], target, Budget(48), steps=6)
    tracer.start()
    while tracer.expand():
        pass
    mine = tracer.finish()
    index = {node: i for i, node in enumerate(node_ids(mine, 3))}
    assert graph["edges"]
    for edge in graph["edges"]:
        want = float(mine.adjacency[index[edge["target"]], index[edge["source"]]])
        assert edge["weight"] == pytest.approx(want, abs=1e-4), edge

    found = error(post(server, "/api/attribution", {"text": TEXT, "integrated_gradients": 33}), 400)
    assert found["param"] == "integrated_gradients"
    directory = build_transcoder_set(TEST_ROOT / "transcoders-ig", seed=12)
    registered = post(server, "/api/transcoders", {"path": str(directory)})
    assert registered.status_code == 201, registered.text
    tc = registered.json()["id"]
    exact = {"text": TEXT, "transcoders": tc, "integrated_gradients": 8}
    found = error(post(server, "/api/attribution", exact), 400)
    assert found["param"] == "integrated_gradients" and "exact" in found["message"]
    api(server, "DELETE", f"/api/transcoders/{tc}")


def test_a_graph_as_a_job_is_the_same_graph_kept_by_id_and_can_be_cancelled(server):
    """POST /api/attribution/jobs checks the body at once (a 400 naming the field, no job), traces
    the graph as a job with its features as progress, keeps it by the id its result names, and it
    is the graph POST /api/attribution computes for the same body. A cancelled job ends as
    cancelled and the server goes on serving graphs."""
    from tests.api.clients import finished_job

    body = {"text": TEXT, "max_feature_nodes": 40, "verify": 3}
    started = post(server, "/api/attribution/jobs", body)
    assert started.status_code == 202, started.text
    job = finished_job(server, started.json()["id"])
    assert job["state"] == "succeeded", job
    assert job["kind"] == "attribution" and job["progress"]["unit"] == "features"
    result = job["result"]
    kept = api(server, "GET", f"/api/attribution/{result['graph_id']}").json()
    assert result["expanded_features"] == kept["expanded_features"] == job["progress"]["done"]
    assert result["edges"] == len(kept["edges"]) and result["method"] == "attribution patching"
    direct = post(server, "/api/attribution", body).json()
    assert [n["id"] for n in kept["nodes"]] == [n["id"] for n in direct["nodes"]]
    weights = {(e["source"], e["target"]): e["weight"] for e in direct["edges"]}
    for edge in kept["edges"]:
        assert edge["weight"] == pytest.approx(weights[(edge["source"], edge["target"])], abs=1e-6)
    check = kept["verification"]
    assert result["check_correlation"] == check["correlation"]

    refused = post(server, "/api/attribution/jobs", {"text": TEXT, "target": {"token": 10**7}})
    assert error(refused, 400)["param"] == "target.token"

    long_text = " ".join(["The capital of France is Paris and the river is wide."] * 12)
    slow = {"text": long_text, "max_feature_nodes": 4096, "integrated_gradients": 32}
    started = post(server, "/api/attribution/jobs", slow)
    assert started.status_code == 202, started.text
    api(server, "DELETE", f"/api/jobs/{started.json()['id']}")
    assert finished_job(server, started.json()["id"])["state"] == "cancelled"
    again = post(server, "/api/attribution", {"text": TEXT, "max_feature_nodes": 8, "verify": 0})
    assert again.status_code == 200, again.text
