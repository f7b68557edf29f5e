"""Acceptance: the workbench on the demo model (SmolLM2-135M-Instruct, its SAE and profiles), one
test per view, each checking what the page shows against the API. With MILLM_UI_SCREENSHOTS set
(scripts/workbench-screenshots) each test also leaves the screenshot docs/ui.md shows.

These tests start a demo server of their own (from the demo server's converted checkpoint): they
change steering, probes, monitoring and the calibration, which the other acceptance tests must not
see."""

from __future__ import annotations

import json
import os
import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.support.model_cache import start_sharing
from tests.support.server import ServerProcess
from tests.ui.test_chat_view import finished, say

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
PIRATE, FRANCE, ITALIAN, MUSIC = 1403, 6, 1496, 1148
WEEKEND = "Tell me about your weekend."
EVALUATED = ["Tell me about your day.", "What should I pack for a weekend trip?"]
# docs/evaluation.md's example runs the documented evaluation and checks its numbers; the page's
# flow needs a smaller one (one instruction, 16 tokens), unless this run takes the screenshot
# docs/ui.md shows, which is of the documented one.
DOCUMENTED = bool(os.environ.get("MILLM_UI_SCREENSHOTS"))


class Demo:
    """The demo server's URLs and a direct API call."""

    def __init__(self, process: ServerProcess):
        self.process, self.base_url, self.url = process, process.base_url, f"{process.base_url}/ui"

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        """A call the page did not make (setting up, or checking what the page did)."""
        return httpx.request(method, f"{self.base_url}{path}", timeout=300, **kwargs)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    # the converted checkpoint: no second conversion
    process = start_sharing("demo", tmp_path_factory.mktemp("ui-demo-home"), [])
    try:
        yield Demo(process)
    finally:
        process.stop()


def show(page, locator) -> None:
    """Scrolls the view so that `locator` starts at the top of the window (for the screenshot)."""
    locator.evaluate("element => element.scrollIntoView({block: 'start'})")


def test_chat_with_a_profile_and_a_probe(demo, page, shoot):
    probe = {
        "name": "pirate-talk",
        "detector": {"type": "feature", "sae_id": SAE, "index": PIRATE, "threshold": 30},
    }
    assert demo.api("POST", "/api/probes", json=probe).status_code == 201
    page.goto(f"{demo.url}#/chat")
    expect(page.get_by_role("status", name="Model state")).to_contain_text(f"{MODEL} · ready")
    page.get_by_label("Max tokens").fill("40")
    page.get_by_label("Temperature").fill("0")
    steering = page.get_by_role("group", name="Steering of this chat")
    steering.get_by_role("combobox", name="Steered by").select_option("profile")
    steering.get_by_role("combobox", name="Profile").select_option("pirate")
    page.get_by_label("Watch with pirate-talk").check()
    say(page, WEEKEND)
    answer = finished(page.get_by_role("article", name="Answer 1"), timeout_ms=300_000)
    direct = demo.api(
        "POST",
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": WEEKEND}],
            "max_tokens": 40,
            "temperature": 0,
            "profile": "pirate",
            "probes": ["pirate-talk"],
        },
    )
    body = direct.json()
    assert answer.locator(".text").text_content() == body["choices"][0]["message"]["content"]
    assert "pirate" in body["choices"][0]["message"]["content"]
    (verdict,) = body["millm"]["probes"]
    assert verdict["fired"]
    row = (
        answer.get_by_role("table", name="Probe verdicts")
        .get_by_role("row")
        .filter(has_text="pirate-talk")
    )
    expect(row).to_contain_text("fired")
    expect(row.get_by_role("listitem").first).to_contain_text(
        f"position {verdict['first_position']}"
    )
    shoot(page, "chat")


def test_compare_unsteered_and_pirate_side_by_side(demo, page, shoot):
    page.goto(f"{demo.url}#/chat")
    page.get_by_label("Max tokens").fill("40")
    page.get_by_label("Temperature").fill("0")
    page.get_by_role("switch", name="Compare").check()
    for n, profile in ((2, "pirate"), (3, "italian-food")):
        if n > 2:
            page.get_by_role("button", name="Add a variant").click()
        variant = page.get_by_role("group", name=f"Variant {n}")
        variant.get_by_role("combobox", name="Steered by").select_option("profile")
        variant.get_by_role("combobox", name="Profile").select_option(profile)
    say(page, WEEKEND)
    turn = finished(page.get_by_role("region", name="Comparison 1"), timeout_ms=300_000)
    direct = demo.api(
        "POST",
        "/api/compare",
        json={
            "messages": [{"role": "user", "content": WEEKEND}],
            "max_tokens": 40,
            "temperature": 0,
            "seed": int(demo_seed(turn)),
            "variants": ["unsteered", {"profile": "pirate"}, {"profile": "italian-food"}],
        },
    ).json()["variants"]
    texts = {
        v["label"]: turn.get_by_role("article", name=v["label"], exact=True)
        .locator(".text")
        .text_content()
        for v in direct
    }
    assert texts == {v["label"]: v["text"] for v in direct}
    assert len(set(texts.values())) == 3 and "pirate" in texts["pirate"]
    shoot(page, "compare")


def demo_seed(turn) -> str:
    """The seed the comparison ran with, as its X-miLLM-Seed header shows it."""
    cell = (
        turn.get_by_role("table", name="Response headers")
        .get_by_role("row")
        .filter(has=turn.page.get_by_role("rowheader", name="X-miLLM-Seed", exact=True))
        .get_by_role("cell")
    )
    return re.match(r"\d+", cell.text_content()).group(0)


def test_search_a_feature_read_its_card_and_steer_it(demo, page, shoot):
    page.goto(f"{demo.url}#/features")
    page.get_by_label("Search labels").fill("pirate")
    page.get_by_role("button", name="Search", exact=True).click()
    results = page.get_by_role("table", name="Search results")
    expect(results.get_by_role("row").nth(1)).to_contain_text(f"#{PIRATE}")
    results.get_by_role("link", name=f"#{PIRATE}", exact=True).click()
    card = page.get_by_role("region", name=f"Feature #{PIRATE}")
    figure = demo.api(
        "GET", f"/api/saes/{SAE}/calibration", params={"features": str(PIRATE)}
    ).json()["features"][0]
    figures = card.get_by_label("Feature figures")
    expect(figures).to_contain_text(str(figure["p99"]))
    expect(figures).to_contain_text(str(figure["p90"]))
    expect(card.locator("mark").first).to_have_text(" pirate")
    card.get_by_label(f"Steer #{PIRATE}", exact=True).fill("40")
    expect(card.get_by_role("status").filter(has_text="Live:")).to_have_text(
        re.compile(r"^Live: add 40\b")
    )
    try:
        live = demo.api("GET", "/api/steering").json()
        assert [(f["index"], f["strength"]) for s in live["saes"] for f in s["features"]] == [
            (PIRATE, 40.0)
        ]
        shoot(page, "features")
        show(page, page.get_by_role("region", name="Live steering"))
        shoot(page, "live-steering")
    finally:
        demo.api("DELETE", "/api/steering/features")


def test_inspect_a_text_and_contrast_two_sets(demo, page, shoot):
    text = "Arr, the pirate ship sailed the seven seas to a bay in Italy for pasta."
    page.goto(f"{demo.url}#/inspect")
    page.get_by_label("Text to inspect").fill(text)
    page.get_by_label("Features to list").fill("8")
    page.get_by_label("Heat map of feature", exact=True).fill(str(PIRATE))
    page.get_by_role("button", name="Inspect", exact=True).click()
    direct = demo.api(
        "POST", f"/api/saes/{SAE}/inspect", json={"text": text, "top_k": 8, "feature": PIRATE}
    ).json()
    table = page.get_by_role("table", name="Top features")
    expect(table.get_by_role("row")).to_have_count(9)
    expect(table.get_by_role("row").nth(1)).to_contain_text(f"#{direct['features'][0]['index']}")
    heat = page.get_by_role("group", name=f"Heat map of feature #{PIRATE}")
    expect(heat.locator("span[aria-label]")).to_have_count(len(direct["tokens"]))
    shoot(page, "inspect")

    # the sets of docs/discovery.md's contrast example, by the mean: the pirate feature #1403 is
    # among the two that lead (#85 "captain / friend / ick" beside it)
    pirate = [
        "Arr, the pirate ship sailed the seven seas.",
        "Ahoy matey, hoist the Jolly Roger!",
        "The captain buried his treasure on the island.",
        "Shiver me timbers, the crew wants rum.",
        "Walk the plank, ye scurvy dog!",
        "The pirates raided the merchant galleon at dawn.",
    ]
    plain = [
        "The train leaves the station at nine.",
        "She bought apples and bread at the market.",
        "The meeting was moved to Thursday afternoon.",
        "He repaired the bicycle in the garage.",
        "The library opens early on weekdays.",
        "Rain is expected later this evening.",
    ]
    page.get_by_label("Set A").fill("\n".join(pirate))
    page.get_by_label("Set B").fill("\n".join(plain))
    page.get_by_label("A text's value").select_option("mean")
    page.get_by_label("Features per side").fill("5")
    page.get_by_role("button", name="Contrast", exact=True).click()
    ranked = demo.api(
        "POST",
        f"/api/saes/{SAE}/contrast",
        json={"a": {"texts": pirate}, "b": {"texts": plain}, "aggregate": "mean", "top_k": 5},
    ).json()
    first, second = (f["index"] for f in ranked["favouring_a"][:2])
    assert PIRATE in (first, second)
    favouring_a = page.get_by_role("table", name="Favouring A")
    expect(favouring_a.get_by_role("row").nth(1)).to_contain_text(f"#{first}")
    expect(favouring_a.get_by_role("row").nth(2)).to_contain_text(f"#{second}")
    show(page, page.get_by_role("region", name="Contrast two sets of texts"))
    shoot(page, "contrast")


def test_profiles_activate_and_deactivate(demo, page, shoot):
    page.goto(f"{demo.url}#/documents")
    panel = page.get_by_role("region", name="Profiles")
    rows = panel.get_by_role("table", name="Profiles").get_by_role("row")
    for name in ("pirate", "france", "italian-food", "music"):
        expect(rows.filter(has_text=name).first).to_be_visible()
    rows.filter(has_text="music").first.get_by_role("button", name="Activate").click()
    expect(page.get_by_label("Steering base now")).to_contain_text("The base is profile music")
    try:
        assert demo.api("GET", "/api/steering").json()["active_profile"]["name"] == "music"
        shoot(page, "profiles")
    finally:
        demo.api("POST", "/api/profiles/deactivate")


def test_probes_list(demo, page, shoot):
    if demo.api("GET", "/api/probes/pirate-talk").status_code == 404:
        demo.api(
            "POST",
            "/api/probes",
            json={
                "name": "pirate-talk",
                "detector": {"type": "feature", "sae_id": SAE, "index": PIRATE, "threshold": 30},
            },
        )
    page.goto(f"{demo.url}#/probes")
    table = page.get_by_role("region", name="Probes", exact=True).get_by_role(
        "table", name="Probes"
    )
    row = table.get_by_role("row").filter(has=page.get_by_text("pirate-talk", exact=True))
    expect(row).to_contain_text(f"#{PIRATE}")
    row.get_by_role("button", name="Activate").click()
    expect(row.get_by_role("button", name="Deactivate")).to_be_visible()
    assert demo.api("GET", "/api/probes/pirate-talk").json()["active"] is True
    shoot(page, "probes")


def test_monitoring_charts_live_requests(demo, page, shoot):
    demo.api(
        "PUT",
        "/api/monitoring",
        json={
            "enabled": True,
            "features": [PIRATE, FRANCE, ITALIAN, MUSIC],
            "top_k": 5,
            "positions": "completion",
            "tokens": True,
            "labels": True,
        },
    )
    page.goto(f"{demo.url}#/monitoring")
    expect(page.get_by_test_id("feed")).to_have_text("live")
    questions = [
        "Tell me about pirates.",
        "What should I cook tonight in Rome?",
        "What is the capital of France?",
        "Sing me a song about the sea.",
    ]
    ids = []
    for n, question in enumerate(questions, start=1):
        reply = demo.api(
            "POST",
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 24,
                "temperature": 0,
            },
        )
        assert reply.status_code == 200
        ids.append(reply.json()["id"])
        expect(page.get_by_test_id("points")).to_have_text(
            f"{n} requests" if n > 1 else "1 request"
        )
    stats = demo.api("GET", "/api/monitoring/stats").json()
    assert stats["requests"] == len(questions)
    expect(page.get_by_role("table", name="Feature statistics").get_by_role("row")).to_have_count(5)
    # its counters refresh half a second after the last record
    expect(page.get_by_role("region", name="Monitoring settings")).to_contain_text(
        f"{len(questions)} requests"
    )
    shoot(page, "monitoring")
    # the France request's record, its answer's text and labels, and its prompt
    records = page.get_by_role("region", name="Latest records")
    records.get_by_role("button", name=ids[2]).click()
    opened = page.get_by_role("region", name=f"Prompt of {ids[2]}")
    expect(opened.get_by_role("group", name="Prompt text")).to_contain_text(questions[2])
    expect(opened.get_by_role("group", name="Prompt text").locator("mark")).to_have_count(1)
    france = demo.api("GET", f"/api/saes/{SAE}/features/{FRANCE}").json()["label"]
    expect(records).to_contain_text(france)  # "Paris / York / Japan"
    show(page, records)
    shoot(page, "monitoring-request")


def test_narrow_window(demo, chromium, shoot):
    context = chromium.new_context(viewport={"width": 420, "height": 860})
    try:
        page = context.new_page()
        page.goto(f"{demo.url}#/features/{SAE}/{PIRATE}")
        card = page.get_by_role("region", name=f"Feature #{PIRATE}")
        expect(card).to_contain_text("pirate")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        show(page, card)
        shoot(page, "narrow")
        # the Inspect tab too, where the shipped transcoder set's name widens the source picker
        page.goto(f"{demo.url}#/inspect")
        expect(page.get_by_label("Feature source")).to_contain_text("smollm2-135m-jumprelu")
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    finally:
        context.close()


def test_models_saes_and_a_calibration_job(demo, page, shoot):
    page.goto(f"{demo.url}#/system")
    expect(
        page.get_by_role("table", name="Registered models")
        .get_by_role("row")
        .filter(has_text=MODEL)
    ).to_contain_text("loaded")
    expect(
        page.get_by_role("table", name="Registered SAEs").get_by_role("row").filter(has_text=SAE)
    ).to_contain_text("layer 12")
    texts = [
        "Arr, the pirate ship sailed the seven seas.",
        "Paris is the capital of France.",
        "Pasta and pizza from Naples.",
        "A melody, a song, a rhythm.",
        "The meeting was moved to Thursday.",
        "The river runs to the sea.",
    ]
    page.get_by_label("Texts, one per line").fill("\n".join(texts))
    page.get_by_role("button", name=f"Calibrate on {len(texts)} texts").click()
    job = page.get_by_role("table", name="Jobs").get_by_role("row").filter(has_text="calibration")
    expect(job.locator("[data-state]")).to_have_text("succeeded", timeout=300_000)
    expect(job).to_contain_text(f"{len(texts)}/{len(texts)} texts (100%)")
    assert demo.api("GET", f"/api/saes/{SAE}/calibration").json()["summary"]["texts"] == len(texts)
    shoot(page, "system")


def test_an_evaluation_ranks_the_pirate_features_strengths_and_the_prompting_baseline(
    demo, page, shoot
):
    """An evaluation started from the page: the pirate feature at three strengths and the
    prompting baseline, judged by the demo model's likelihoods, its ranking and answers shown."""
    instructions, tokens = (EVALUATED, "32") if DOCUMENTED else (EVALUATED[:1], "16")
    page.goto(f"{demo.url}#/evaluate")
    expect(page.get_by_role("status", name="Model state")).to_contain_text(f"{MODEL} · ready")
    form = page.get_by_role("form", name="New evaluation")
    form.get_by_label("Concept").fill("pirates")
    form.get_by_label("Name (optional)").fill("pirate sweep")
    form.get_by_label("Feature").fill(str(PIRATE))
    form.get_by_label("Strengths").fill("20, 40, 80")
    form.get_by_label("Instructions, one per line").fill("\n".join(instructions))
    form.get_by_label("Max tokens").fill(tokens)
    form.get_by_role("button", name="Start the evaluation").click()
    result = page.get_by_role("region", name="Evaluation: pirate sweep")
    expect(result).to_be_visible(timeout=300_000)
    stored = demo.api("GET", "/api/evaluations").json()["data"]
    (summary,) = [e for e in stored if e["name"] == "pirate sweep"]
    full = demo.api("GET", f"/api/evaluations/{summary['id']}").json()
    feature, prompting = full["candidates"]
    assert [p["strength"] for p in feature["points"]] == [20, 40, 80]
    assert [len(p["samples"]) for p in feature["points"]] == [len(instructions)] * 3
    assert prompting["label"] == "prompting" and full["baseline"]["perplexity"] > 1
    # The steering brings the concept in at its strongest (the documented numbers, over two
    # instructions and 32 tokens, are checked by docs/evaluation.md's example).
    assert feature["points"][-1]["concept"] > full["baseline"]["concept"]
    ranking = result.get_by_role("table", name="Ranking")
    expect(ranking.get_by_role("row").nth(1)).to_contain_text(full["ranking"][0]["label"])
    expect(ranking.get_by_role("row")).to_have_count(len(full["ranking"]) + 1)
    result.get_by_role("button", name=f"Answers of {feature['label']} at 80").click()
    expect(result.get_by_role("region", name="Answers")).to_contain_text(
        feature["points"][2]["samples"][0]["text"].strip()[:40]
    )
    show(page, result)
    shoot(page, "evaluate")


def test_the_logit_lens_shows_paris_arriving_in_the_last_blocks(demo, page, shoot):
    page.goto(f"{demo.url}#/inspect")
    form = page.get_by_role("form", name="Logit lens")
    form.get_by_label("Text").fill("The capital of France is")
    form.get_by_role("button", name="Read").click()
    grid = page.get_by_role("table", name="Logit lens")
    expect(grid).to_be_visible(timeout=120_000)
    expect(grid.get_by_role("row").nth(1).get_by_role("cell").last).to_have_text("Paris")
    lens = demo.api(
        "POST", "/api/lens", json={"text": "The capital of France is", "positions": "last"}
    ).json()
    (last,) = lens["predictions"]
    assert last["final"]["token"] == " Paris"
    # Early blocks give " Paris" almost nothing; the last blocks bring it in.
    by_layer = {c["layer"]: c["final_probability"] for c in last["layers"]}
    assert max(by_layer[layer] for layer in range(20)) < 0.01
    assert by_layer[29] > by_layer[27] > by_layer[20]
    show(page, page.get_by_role("region", name="Logit lens"))
    shoot(page, "lens")


def test_the_attribution_graph_traces_paris_and_its_check_holds(demo, page, shoot):
    page.goto(f"{demo.url}#/inspect")
    form = page.get_by_role("form", name="Attribution graph")
    form.get_by_label("Text").fill("The capital of France is")
    form.get_by_label("Features expanded").fill("64")
    form.get_by_role("button", name="Trace").click()
    summary = page.get_by_label("Graph summary")
    expect(summary).to_contain_text("Paris", timeout=240_000)
    expect(summary).to_contain_text("check passed")
    picture = page.get_by_role("img", name="Attribution graph")
    expect(picture).to_be_visible()
    # The documented promise, on the graph the page drew: a Paris-related feature, a passing check.
    traced = demo.api(
        "POST",
        "/api/attribution",
        json={"text": "The capital of France is", "max_feature_nodes": 64},
    ).json()
    assert traced["target"]["tokens"] == [" Paris"]
    paris = [n for n in traced["nodes"] if n["kind"] == "feature" and "Paris" in (n["label"] or "")]
    assert paris, "no feature labelled with Paris carries the answer"
    assert traced["verification"]["passed"] and traced["verification"]["correlation"] >= 0.7
    picture.locator(f'circle[data-node="{paris[0]["id"]}"]').click()
    card = page.get_by_label("Node")
    expect(card).to_contain_text(paris[0]["label"])
    card.get_by_role("checkbox").check()
    page.get_by_role("button", name="Ablate 1 feature (every position) and generate").click()
    expect(page.get_by_text("ablated", exact=True)).to_be_visible(timeout=120_000)
    show(page, page.get_by_role("region", name="Attribution graph"))
    shoot(page, "attribution")


def test_the_demo_transcoder_set_traces_paris_as_the_exact_kind(demo, page, shoot):
    """The shipped transcoder set is registered at the first start; picked in the panel, it gives
    the exact kind of graph (a transcoder on every block), with labelled features; the top
    feature's block attaches from its card, and ablating it lowers " Paris"."""
    (shipped,) = [
        s
        for s in demo.api("GET", "/api/transcoders").json()["data"]
        if s["path"].endswith("smollm2-135m-jumprelu")
    ]
    assert shipped["layers"] == list(range(30)) and shipped["labelled_features"] > 9000
    page.goto(f"{demo.url}#/inspect")
    form = page.get_by_role("form", name="Attribution graph")
    form.get_by_label("Feature source").select_option(
        label="transcoders smollm2-135m-jumprelu (30 blocks × 320)"
    )
    form.get_by_label("Text").fill("The capital of France is")
    form.get_by_label("Features expanded").fill("64")
    form.get_by_role("button", name="Trace").click()
    summary = page.get_by_label("Graph summary")
    expect(summary).to_contain_text("Paris", timeout=240_000)
    expect(summary).to_contain_text("· transcoders ·")
    picture = page.get_by_role("img", name="Attribution graph")
    expect(picture).to_be_visible()
    traced = demo.api(
        "POST",
        "/api/attribution",
        json={
            "text": "The capital of France is",
            "transcoders": shipped["id"],
            "max_feature_nodes": 64,
        },
    ).json()
    assert traced["target"]["tokens"] == [" Paris"] and traced["method"] == "transcoders"
    features = [n for n in traced["nodes"] if n["kind"] == "feature"]
    # Labelled from the files beside each transcoder (features that fired in the set's corpus).
    assert features and sum(bool(n["label"]) for n in features) >= 0.9 * len(features)
    top = min(features, key=lambda n: n["influence"])
    picture.locator(f'circle[data-node="{top["id"]}"]').click()
    card = page.get_by_label("Node")
    expect(card).to_contain_text(top["label"])
    try:
        card.get_by_role(
            "button", name=f"Attach block {top['layer']}'s transcoder to steer it"
        ).click()
        card.get_by_label("ablate this feature").check()
        page.get_by_role("button", name="Ablate 1 feature (every position) and generate").click()
        unsteered = page.get_by_role("region", name="Next tokens unsteered")
        ablated = page.get_by_role("region", name="Next tokens ablated")
        expect(ablated).to_contain_text("Paris", timeout=60_000)
        served_p, ablated_p = (
            float(side.locator("li", has_text="Paris").first.inner_text().split()[-1])
            for side in (unsteered, ablated)
        )
        assert ablated_p < served_p  # the graph's top feature carried " Paris"
        show(page, page.get_by_role("region", name="Attribution graph"))
        shoot(page, "attribution-transcoders")
        show(page, page.locator(".ablation"))
        shoot(page, "attribution-transcoders-ablated")
    finally:
        for sae in demo.api("GET", "/api/saes").json()["data"]:
            if sae["format"] == "transcoder":
                demo.api("POST", f"/api/saes/{sae['id']}/detach")


def test_a_batch_uploaded_from_the_page_answers_every_line(demo, page, tmp_path, shoot):
    rows = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "max_tokens": 8, "temperature": 0,
                  "messages": [{"role": "user", "content": f"Say the number {i}."}]}}
        for i in range(6)
    ]  # fmt: skip
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    page.goto(f"{demo.url}#/batches")
    form = page.get_by_role("form", name="New batch")
    form.get_by_label("JSONL file").set_input_files(str(path))
    form.get_by_role("button", name="Start batch").click()
    said = page.get_by_role("region", name="Batches").get_by_role("status")
    expect(said).to_contain_text("started")
    batch_id = said.text_content().split()[1]
    row = page.get_by_role("table", name="Batches").get_by_role("row").filter(has_text=batch_id)
    expect(row.locator("[data-status]")).to_have_attribute(
        "data-status", "completed", timeout=300_000
    )
    expect(row).to_contain_text("6 completed · 0 failed")
    ended = demo.api("GET", f"/v1/batches/{batch_id}").json()
    assert ended["model"] == MODEL and ended["request_counts"]["completed"] == 6
    shoot(page, "batches")
