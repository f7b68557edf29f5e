"""The Features view: ranked label search, a feature's card (label, neighbours, calibrated figures),
the steer slider and the live steering table (remove, clear, enable/disable, save as a profile),
making a probe from a card, and an API refusal shown as its message."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

TEXTS = [
    f"The river {i} runs through Paris and meets the sea at dawn, past {i} bridges."
    for i in range(10)
]


def cells(table, column: int):
    """The cells of one column of a workbench table (body rows only)."""
    return table.locator(f"tbody tr td:nth-child({column})")


def numbers(locator) -> list[float]:
    """The numbers a list of cells shows."""
    return [float(text.replace("−", "-")) for text in locator.all_inner_texts()]


def live(workbench) -> dict[int, dict]:
    """The live features of the workbench's SAE, by index."""
    state = workbench.api("GET", "/api/steering").json()
    entry = next((s for s in state["saes"] if s["sae_id"] == workbench.sae), None)
    return {f["index"]: f for f in entry["features"]} if entry else {}


@pytest.fixture
def clean(workbench):
    """No live values and steering enabled before and after the test (tests share the server)."""
    workbench.api("DELETE", "/api/steering/features")
    workbench.api("POST", "/api/steering/enable")
    yield
    workbench.api("DELETE", "/api/steering/features")
    workbench.api("POST", "/api/steering/enable")


def test_search_lists_features_in_the_apis_ranking(workbench, page):
    expected = workbench.api(
        "GET", f"/api/saes/{workbench.sae}/features", params={"q": "paris", "limit": 50}
    ).json()["data"]
    # the "paris" features, ranked by the API
    assert {f["index"] for f in expected} == set(range(0, 128, 10))
    page.goto(f"{workbench.url}#/features")
    page.get_by_label("Search labels").fill("paris")
    page.get_by_role("button", name="Search", exact=True).click()
    table = page.get_by_role("table", name="Search results")
    expect(cells(table, 1)).to_have_text([f"#{f['index']}" for f in expected])
    expect(cells(table, 2)).to_have_text([f["label"] for f in expected])
    assert numbers(cells(table, 3)) == pytest.approx([f["score"] for f in expected], rel=1e-3)
    # a result opens its card
    table.get_by_role("link", name=f"#{expected[1]['index']}", exact=True).click()
    card = page.get_by_role("region", name=f"Feature #{expected[1]['index']}")
    expect(card.locator(".feature-label")).to_contain_text(expected[1]["label"])


def wait_for_job(workbench, job_id: str, timeout: float = 180) -> dict:
    """Poll the job until it ends (an API wait, not a page one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = workbench.api("GET", f"/api/jobs/{job_id}").json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end in {timeout} s")


def test_a_card_shows_label_neighbours_and_the_calibrated_figures(workbench, page):
    sae = workbench.sae
    detail = workbench.api("GET", f"/api/saes/{sae}/features/10", params={"k": 10}).json()
    page.goto(f"{workbench.url}#/features/{sae}/10")
    card = page.get_by_role("region", name="Feature #10")
    expect(card.locator(".feature-label")).to_contain_text("feature 10 paris")
    neighbours = card.get_by_role("table", name="Nearest neighbours")
    expect(cells(neighbours, 1)).to_have_text([f"#{n['index']}" for n in detail["neighbours"]])
    assert numbers(cells(neighbours, 3)) == pytest.approx(
        [n["cosine"] for n in detail["neighbours"]], abs=1e-3
    )
    figures = card.get_by_label("Feature figures")
    expect(
        figures.locator("div", has=page.locator("dt", has_text="Decoder norm")).locator(".num")
    ).to_have_text(re.compile(r"^[\d.]+$"))
    if workbench.api("GET", f"/api/saes/{sae}/calibration").status_code == 404:
        expect(card.get_by_role("note")).to_contain_text("no calibration")
        expect(card.get_by_role("link", name="Models, SAEs & jobs")).to_have_attribute(
            "href", "#/system"
        )

    started = workbench.api("POST", f"/api/saes/{sae}/calibrate", json={"texts": TEXTS})
    assert started.status_code == 202, started.text
    assert wait_for_job(workbench, started.json()["id"])["state"] == "succeeded"
    everything = workbench.api(
        "GET", f"/api/saes/{sae}/calibration", params={"features": ",".join(map(str, range(128)))}
    ).json()
    # a feature with quantiles to show
    fired = max(everything["features"], key=lambda f: f["count"])
    page.goto(f"{workbench.url}#/features/{sae}/{fired['index']}")
    card = page.get_by_role("region", name=f"Feature #{fired['index']}")
    figures = card.get_by_label("Feature figures")

    def figure(name: str):
        return figures.locator(
            "div", has=page.locator("dt", has_text=re.compile(f"^{re.escape(name)}"))
        ).locator(".num")

    expect(figure("p50")).to_have_text(re.compile(r"\d"))
    for key, name in [
        ("p50", "p50"),
        ("p90", "p90"),
        ("p99", "p99"),
        ("max", "Max"),
        ("mean", "Mean"),
        ("frequency", "Density"),
    ]:
        assert float(figure(name).inner_text()) == fired[key], (
            name,
            figure(name).inner_text(),
            fired[key],
        )
    assert int(figure("Fired at").inner_text()) == fired["count"]
    snippets = card.locator(".snippets li")
    expect(snippets).to_have_count(len(fired["top_examples"]))
    expect(snippets.first.locator("mark")).to_have_text(fired["top_examples"][0]["token"])


def test_the_steer_slider_and_number_set_the_live_value(workbench, page, clean):
    sae = workbench.sae
    page.goto(f"{workbench.url}#/features/{sae}/20")
    card = page.get_by_role("region", name="Feature #20")
    card.get_by_label("Steer #20", exact=True).fill("40")
    expect(card.get_by_role("status").filter(has_text="Live:")).to_have_text(
        re.compile(r"^Live: add 40\b")
    )
    assert live(workbench)[20] == {"index": 20, "op": "add", "strength": 40.0}

    number = card.get_by_label("Strength of #20", exact=True)
    number.fill("-12.5")
    number.press("Enter")
    expect(card.get_by_role("status").filter(has_text="Live:")).to_have_text(
        re.compile(r"^Live: add -12.5\b")
    )
    assert live(workbench)[20]["strength"] == -12.5
    table = page.get_by_role("table", name="Live steering")
    row = table.get_by_role("row").filter(has_text="#20")
    expect(row.get_by_label("Strength of #20", exact=True)).to_have_value("-12.5")

    # the table's own slider changes it too
    row.get_by_label("Steer #20", exact=True).fill("75")
    expect(number).to_have_value("75")
    assert live(workbench)[20]["strength"] == 75.0

    # 0 clears
    number.fill("0")
    number.press("Enter")
    expect(card.get_by_role("status").filter(has_text="Not steered")).to_be_visible()
    assert 20 not in live(workbench)
    expect(table).to_have_count(0)


def test_remove_and_clear_all_in_the_live_table(workbench, page, clean):
    sae = workbench.sae
    for index, strength in [(30, 5.0), (31, -7.0), (32, 9.0)]:
        workbench.api(
            "PUT", f"/api/steering/saes/{sae}/features/{index}", json={"strength": strength}
        )
    workbench.api(
        "PUT", f"/api/steering/saes/{sae}/features/33", json={"op": "cap", "value": 2.5}
    ).raise_for_status()
    page.goto(f"{workbench.url}#/features")
    table = page.get_by_role("table", name="Live steering")
    expect(cells(table, 1).locator("a")).to_have_text(["#30", "#31", "#32", "#33"])
    expect(table.get_by_role("row").filter(has_text="#33")).to_contain_text("cap")
    expect(table.get_by_label("cap value of #33")).to_have_value("2.5")
    # labels fetched per live feature
    expect(cells(table, 1).nth(0)).to_contain_text("feature 30 paris")

    table.get_by_role("button", name="Remove #31").click()
    expect(cells(table, 1).locator("a")).to_have_text(["#30", "#32", "#33"])
    assert sorted(live(workbench)) == [30, 32, 33]

    page.get_by_role("button", name="Clear all").click()
    expect(page.get_by_role("region", name="Live steering")).to_contain_text(
        "No feature is steered live"
    )
    assert live(workbench) == {}


def test_enable_disable_and_save_the_live_values_as_a_profile(workbench, page, clean):
    sae = workbench.sae
    workbench.api("PUT", f"/api/steering/saes/{sae}/features/40", json={"strength": 25})
    page.goto(f"{workbench.url}#/features")
    badge = page.get_by_role("status", name="Global steering")
    expect(badge).to_have_text("steering on")
    page.get_by_role("button", name="Disable steering").click()
    expect(badge).to_have_text("steering off")
    assert workbench.api("GET", "/api/steering").json()["enabled"] is False
    page.get_by_role("button", name="Enable steering").click()
    expect(badge).to_have_text("steering on")
    assert workbench.api("GET", "/api/steering").json()["enabled"] is True

    page.get_by_label("Save the live values as a profile named").fill("saved-from-the-page")
    page.get_by_role("button", name="Save as profile").click()
    expect(page.get_by_role("status").filter(has_text="Saved profile")).to_contain_text(
        "saved-from-the-page"
    )
    profiles = {p["name"]: p for p in workbench.api("GET", "/api/profiles").json()["data"]}
    steering = profiles["saved-from-the-page"]["document"]["steering"]
    assert steering[0]["sae_id"] == sae
    assert steering[0]["features"] == [{"index": 40, "op": "add", "strength": 25.0}]

    # a second save under the same name is refused, with the API's message
    page.get_by_label("Save the live values as a profile named").fill("saved-from-the-page")
    page.get_by_role("button", name="Save as profile").click()
    expect(page.get_by_role("region", name="Live steering").get_by_role("alert")).to_have_text(
        "409 profile_exists: a profile named 'saved-from-the-page' exists"
    )


def test_make_a_probe_from_a_card(workbench, page):
    sae = workbench.sae
    page.goto(f"{workbench.url}#/features/{sae}/50")
    card = page.get_by_role("region", name="Feature #50")
    card.get_by_role("button", name="Make a probe…").click()
    form = card.get_by_role("form", name="Make a probe")
    form.get_by_label("Probe name").fill("paris-50")
    form.get_by_label("a raw activation").check()
    form.get_by_label("Threshold").fill("2.5")
    form.get_by_role("button", name="Create probe").click()
    expect(form.get_by_role("status")).to_contain_text("Probe “paris-50” saved")
    expect(form.get_by_role("link", name="Open Probes")).to_have_attribute("href", "#/probes")
    probes = {p["name"]: p for p in workbench.api("GET", "/api/probes").json()["data"]}
    assert probes["paris-50"]["document"]["detector"] == {
        "type": "feature",
        "sae_id": sae,
        "index": 50,
        "threshold": 2.5,
    }
    assert probes["paris-50"]["active"] is False


def test_a_feature_past_the_width_shows_the_apis_message(workbench, page):
    answer = workbench.api("GET", f"/api/saes/{workbench.sae}/features/999", params={"k": 10})
    assert answer.status_code == 400
    error = answer.json()["error"]
    page.goto(f"{workbench.url}#/features/{workbench.sae}/999")
    alert = page.get_by_role("region", name="Feature #999").get_by_role("alert")
    expect(alert).to_have_text(f"400 {error['code']}: {error['message']}")


def test_the_labels_are_embedded_for_search_by_meaning_as_a_job(workbench, page):
    """With search by meaning chosen, "Embed the labels now" starts the embedding job (the served
    model embeds here) and shows its progress over every labelled feature."""
    labelled = workbench.api("GET", f"/api/saes/{workbench.sae}/features", params={"q": ""})
    total = labelled.json()["labels"]
    page.goto(f"{workbench.url}#/features")
    page.locator("select[name=by]").select_option("meaning")
    page.get_by_role("button", name="Embed the labels now").click()
    job = page.get_by_label("Embedding job")
    expect(job.locator("[data-state]")).to_have_text("succeeded", timeout=60_000)
    expect(job.locator(".progress")).to_contain_text(f"{total}/{total} labels")
