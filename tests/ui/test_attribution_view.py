"""The Inspect view's attribution graph panel: the graph the API traces (its nodes, a node's card,
the export), integrated gradients, transcoder sets as a source (their features attached to be
ablated), ablation beside the unsteered model whatever is live, and a graph saved as a profile or
circuit and opened from a file."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.api.clients import MODEL


def test_the_attribution_graph_draws_the_apis_nodes_and_their_cards(workbench, page):
    page.goto(f"{workbench.url}#/inspect")
    form = page.get_by_role("form", name="Attribution graph")
    form.get_by_label("Text").fill("The river runs")
    form.get_by_label("Features expanded").fill("16")
    form.get_by_role("button", name="Trace").click()
    picture = page.get_by_role("img", name="Attribution graph")
    expect(picture).to_be_visible()
    graph = workbench.api(
        "POST", "/api/attribution", json={"text": "The river runs", "max_feature_nodes": 16}
    ).json()
    summary = page.get_by_label("Graph summary")
    expect(summary).to_contain_text(f"{graph['expanded_features']} features expanded")
    expect(summary).to_contain_text("passed" if graph["verification"]["passed"] else "failed")
    # Traced as a job: its progress counts the features expanded.
    job = page.get_by_label("Attribution job")
    expect(job).to_contain_text(f"{graph['expanded_features']}/16 features")
    expect(job.locator("[data-state]")).to_have_text("succeeded")
    features = [n for n in graph["nodes"] if n["kind"] == "feature"]
    expect(picture.locator("circle.feature")).to_have_count(len(features))
    expect(picture.locator("circle.target")).to_have_count(1)
    expect(picture.locator("text.token")).to_have_count(len(graph["tokens"]))
    top = min(features, key=lambda n: n["influence"])
    picture.locator(f'circle[data-node="{top["id"]}"]').click()
    card = page.get_by_label("Node")
    expect(card).to_contain_text(f"position {top['position']}")
    expect(card.get_by_role("link")).to_have_text(re.compile(f"^#{top['feature']}\\b"))
    with page.expect_download() as download:
        summary.get_by_role("button", name="export (circuit-tracer JSON)").click()
    exported = json.loads(Path(download.value.path()).read_text())
    assert {n["node_id"] for n in exported["nodes"]} >= {top["id"]}


def test_a_graph_with_integrated_gradients_says_so_and_draws_the_apis_graph(workbench, page):
    page.goto(f"{workbench.url}#/inspect")
    form = page.get_by_role("form", name="Attribution graph")
    form.get_by_label("Text").fill("The river runs")
    form.get_by_label("Features expanded").fill("8")
    form.get_by_label("Gradients").select_option(label="integrated, 8 steps")
    form.get_by_role("button", name="Trace").click()
    summary = page.get_by_label("Graph summary")
    expect(summary).to_contain_text("· integrated gradients ·")
    body = {"text": "The river runs", "max_feature_nodes": 8, "integrated_gradients": 8}
    graph = workbench.api("POST", "/api/attribution", json=body).json()
    features = [n for n in graph["nodes"] if n["kind"] == "feature"]
    picture = page.get_by_role("img", name="Attribution graph")
    expect(picture.locator("circle.feature")).to_have_count(len(features))
    expect(summary).to_contain_text(f"{graph['expanded_features']} features expanded")


def test_a_registered_transcoder_set_is_a_source_to_trace_from(workbench, page):
    """The source picker lists the registered sets; a graph traced from one is the exact kind;
    a feature's card attaches its block's transcoder file as an SAE, then links to its feature
    page and ablates it."""
    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_transcoder_set

    directory = build_transcoder_set(TEST_ROOT / "transcoders-ui", seed=5, labels=True)
    registered = workbench.api("POST", "/api/transcoders", json={"path": str(directory)}).json()
    try:
        page.goto(f"{workbench.url}#/inspect")
        form = page.get_by_role("form", name="Attribution graph")
        form.get_by_label("Feature source").select_option(
            label="transcoders transcoders-ui (3 blocks × 48)"
        )
        form.get_by_label("Text").fill("The river runs")
        form.get_by_label("Features expanded").fill("16")
        form.get_by_role("button", name="Trace").click()
        summary = page.get_by_label("Graph summary")
        expect(summary).to_contain_text("· transcoders ·")
        graph = workbench.api(
            "POST",
            "/api/attribution",
            json={
                "text": "The river runs",
                "max_feature_nodes": 16,
                "transcoders": registered["id"],
            },
        ).json()
        features = [n for n in graph["nodes"] if n["kind"] == "feature"]
        picture = page.get_by_role("img", name="Attribution graph")
        expect(picture.locator("circle.feature")).to_have_count(len(features))
        picture.locator(f'circle[data-node="{features[0]["id"]}"]').click()
        card = page.get_by_label("Node")
        layer = features[0]["layer"]
        expect(card).to_contain_text(f"#{features[0]['feature']} block {layer} #")
        expect(card.get_by_role("link")).to_have_count(0)  # not an SAE yet: no feature page
        card.get_by_role("button", name=f"Attach block {layer}'s transcoder to steer it").click()
        expect(card.get_by_role("link")).to_have_count(1)
        card.get_by_label("ablate this feature").check()
        page.get_by_role("button", name="Ablate 1 feature (every position) and generate").click()
        expect(page.get_by_role("heading", name="ablated")).to_be_visible()
        attached = [
            s
            for s in workbench.api("GET", "/api/saes").json()["data"]
            if s["format"] == "transcoder" and s["attached"]
        ]
        assert [s["path"] for s in attached] == [registered["files"][layer]]
    finally:
        for sae in workbench.api("GET", "/api/saes").json()["data"]:
            if sae["format"] == "transcoder":
                workbench.api("POST", f"/api/saes/{sae['id']}/detach")
        workbench.api("DELETE", f"/api/transcoders/{registered['id']}")


def test_a_cross_layer_transcoders_feature_attaches_its_block_and_ablates(workbench, page):
    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_clt

    directory = build_clt(TEST_ROOT / "clt-ui", seed=8)
    registered = workbench.api("POST", "/api/transcoders", json={"path": str(directory)}).json()
    try:
        page.goto(f"{workbench.url}#/inspect")
        form = page.get_by_role("form", name="Attribution graph")
        form.get_by_label("Feature source").select_option(
            label="cross-layer transcoder clt-ui (3 blocks × 48)"
        )
        form.get_by_label("Text").fill("The river runs")
        form.get_by_label("Features expanded").fill("8")
        form.get_by_role("button", name="Trace").click()
        expect(page.get_by_label("Graph summary")).to_contain_text("· transcoders ·")
        page.get_by_role("img", name="Attribution graph").locator("circle.feature").first.click()
        card = page.get_by_label("Node")
        card.get_by_role("button", name=re.compile("Attach block .* to steer it")).click()
        expect(card.get_by_role("link")).to_have_count(1)
        card.get_by_label("ablate this feature").check()
        page.get_by_role("button", name="Ablate 1 feature (every position) and generate").click()
        expect(page.get_by_role("heading", name="ablated")).to_be_visible()
    finally:
        for sae in workbench.api("GET", "/api/saes").json()["data"]:
            if sae["format"] == "transcoder":
                workbench.api("POST", f"/api/saes/{sae['id']}/detach")
        workbench.api("DELETE", f"/api/transcoders/{registered['id']}")


def test_ticked_features_save_as_a_profile_and_a_graph_file_opens(workbench, page, tmp_path):
    page.goto(f"{workbench.url}#/inspect")
    form = page.get_by_role("form", name="Attribution graph")
    form.get_by_label("Text").fill("The river runs")
    form.get_by_role("button", name="Trace").click()
    picture = page.get_by_role("img", name="Attribution graph")
    expect(picture).to_be_visible()
    picture.locator("circle.feature").first.click()
    page.get_by_label("Node").get_by_role("checkbox").check()
    page.get_by_label("Profile or circuit name").fill("from-the-graph")
    page.get_by_role("button", name="Save as a profile that ablates them").click()
    expect(page.get_by_text("Saved profile from-the-graph")).to_be_visible()
    stored = workbench.api("GET", "/api/profiles/from-the-graph").json()
    assert [f["op"] for f in stored["document"]["steering"][0]["features"]] == ["ablate"]
    page.get_by_label("Circuit strength").fill("15")
    page.get_by_role("button", name="Save as a circuit").click()
    expect(page.get_by_text("Saved circuit from-the-graph")).to_be_visible()
    circuit = workbench.api("GET", "/api/circuits/from-the-graph/export").json()
    assert [m["feature"]["strength"] for m in circuit["members"]] == [15.0]
    workbench.api("DELETE", "/api/circuits/from-the-graph")
    graph = workbench.api(
        "POST", "/api/attribution", json={"text": "The river runs", "max_feature_nodes": 8}
    ).json()
    exported = workbench.api("GET", f"/api/attribution/{graph['id']}/export").text
    path = tmp_path / "graph.json"
    path.write_text(exported)
    form.locator("input[type=file]").set_input_files(str(path))
    summary = page.get_by_label("Graph summary")
    expect(summary).to_contain_text("imported")
    expect(picture.locator("circle.feature")).to_have_count(
        sum(n["kind"] == "feature" for n in graph["nodes"])
    )
    workbench.api("DELETE", "/api/profiles/from-the-graph")


def probabilities(side) -> list[float]:
    """The next-token probabilities one side of an ablation lists, as numbers."""
    return [float(item.split()[-1]) for item in side.locator("ol li").all_inner_texts()]


def top_probability(answer: dict) -> float:
    """The most probable next token's probability in a /v1/completions answer."""
    return max(math.exp(lp) for lp in answer["choices"][0]["logprobs"]["top_logprobs"][0].values())


def test_an_ablation_runs_on_the_unsteered_model_while_a_feature_is_steered_live(workbench, page):
    """With a feature steered live (what every /v1 request gets), the graph is traced unsteered,
    and both sides of its ablation run unsteered too, each saying so: the unsteered side's top
    probability is an unsteered /v1/completions answer's, not the live one's."""
    text = "The river runs"
    # Two tokens: with one, logprobs make it a scoring request, which is never steered.
    body = {"model": MODEL, "prompt": text, "max_tokens": 2, "temperature": 0, "logprobs": 5}
    set_live = f"/api/steering/saes/{workbench.sae}/features/3"
    assert workbench.api("PUT", set_live, json={"strength": 43}).json()["live"]
    try:
        live = top_probability(workbench.api("POST", "/v1/completions", json=body).json())
        page.goto(f"{workbench.url}#/inspect")
        expect(page.get_by_role("region", name="What /v1 gets now")).to_contain_text("#3 +43")
        form = page.get_by_role("form", name="Attribution graph")
        form.get_by_label("Text").fill(text)
        form.get_by_label("Features expanded").fill("16")
        form.get_by_role("button", name="Trace").click()
        expect(page.get_by_label("Graph summary")).to_contain_text("· traced unsteered ·")
        form.get_by_label("Text").fill("An edited box is not what the graph read")
        page.get_by_role("img", name="Attribution graph").locator("circle.feature").first.click()
        page.get_by_label("Node").get_by_label("ablate this feature").check()
        held = []  # the first generation waits until the busy line has been seen

        def hold_first(route):
            if held:
                route.continue_()
            else:
                held.append(route)

        page.route("**/v1/completions", hold_first)
        page.get_by_role("button", name="Ablate 1 feature (every position) and generate").click()
        busy = page.get_by_role("status").filter(has_text="Generating on the unsteered model")
        expect(busy).to_be_visible()
        held[0].continue_()
        unsteered = page.get_by_role("region", name="Next tokens unsteered")
        ablated = page.get_by_role("region", name="Next tokens ablated")
        expect(unsteered).to_contain_text("unsteered, as the graph was traced")
        expect(ablated).to_contain_text("1 feature ablated, on the unsteered model")
        shown = probabilities(unsteered)
    finally:
        workbench.api("DELETE", set_live)
    plain = top_probability(workbench.api("POST", "/v1/completions", json=body).json())
    assert shown[0] == pytest.approx(plain, rel=5e-3)  # the page shows 3 significant digits
    assert abs(live - plain) > 0.01 * plain  # and the live steering would have moved it
