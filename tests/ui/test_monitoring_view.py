"""Monitoring in the workbench: turned on and configured from the page, the live chart receives a
point per generation request from /api/monitoring/stream, the statistics table shows the API's
figures, and a record shows its token text and labels and opens its request's prompt."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.api.clients import MODEL, post

WATCHED = [3, 17, 42]


def generate(workbench, text: str) -> dict:
    reply = post(
        workbench.process,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 6,
            "temperature": 0,
        },
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_settings_made_on_the_page_are_the_apis(workbench, page):
    page.goto(f"{workbench.url}#/monitoring")
    expect(page.get_by_test_id("monitoring-state")).to_have_text("off")
    page.get_by_label("Watched features").fill(", ".join(map(str, WATCHED)))
    page.get_by_label("Top features per position").fill("4")
    page.get_by_label("Positions").select_option("all")
    page.get_by_role("button", name="Save settings").click()
    page.get_by_role("button", name="Turn on").click()
    expect(page.get_by_test_id("monitoring-state")).to_have_text("on")
    settings = workbench.api("GET", "/api/monitoring").json()
    assert (
        settings["enabled"],
        settings["features"],
        settings["top_k"],
        settings["positions"],
    ) == (True, WATCHED, 4, "all")


def test_the_live_chart_receives_a_point_per_request(workbench, page):
    workbench.api("POST", "/api/monitoring/reset")
    workbench.api(
        "PUT",
        "/api/monitoring",
        json={"enabled": True, "features": WATCHED, "top_k": 4, "positions": "all"},
    )
    page.goto(f"{workbench.url}#/monitoring")
    expect(page.get_by_test_id("feed")).to_have_text("live")
    for n, text in enumerate(
        ["Tell me about the river.", "Paris in the spring", "Count to five"], start=1
    ):
        generate(workbench, text)
        expect(page.get_by_test_id("points")).to_have_text(
            f"{n} requests" if n > 1 else "1 request"
        )
    # uPlot drew one series per watched feature (its legend names them) on its canvas
    chart = page.get_by_role("img", name="Peak activation per request of features 3, 17, 42")
    expect(chart.locator("canvas")).to_have_count(1)
    expect(chart.locator(".u-legend")).to_contain_text("#17")
    # the chart's points are the records' peaks: read them back from uPlot's own data
    stats = workbench.api("GET", "/api/monitoring/stats").json()
    assert stats["requests"] == 3
    table = page.get_by_role("table", name="Feature statistics")
    for feature in stats["features"]:
        row = table.get_by_role("row").filter(
            has=page.get_by_role("link", name=f"#{feature['index']}", exact=True)
        )
        expect(row).to_contain_text(str(feature["count"]))
        if feature["max"]:
            expect(row).to_contain_text(str(float(f"{feature['max']:.4g}")).removesuffix(".0"))


def test_turning_monitoring_off_and_a_refused_setting(workbench, page):
    workbench.api("PUT", "/api/monitoring", json={"enabled": True})
    page.goto(f"{workbench.url}#/monitoring")
    page.get_by_label("Top features per position").fill("65")
    page.get_by_role("button", name="Save settings").click()
    expect(
        page.get_by_role("region", name="Monitoring settings").get_by_role("alert")
    ).to_contain_text("400 invalid_parameter: top_k")
    assert workbench.api("GET", "/api/monitoring").json()["top_k"] != 65
    page.get_by_role("button", name="Turn off").click()
    expect(page.get_by_test_id("monitoring-state")).to_have_text("off")
    assert workbench.api("GET", "/api/monitoring").json()["enabled"] is False


def strongest(record: dict) -> dict:
    """The record's feature with the largest value at any position (as the page ranks them)."""
    best: dict[int, dict] = {}
    for position in record["positions"]:
        for entry in position["features"]:
            if entry["value"] > best.get(entry["index"], {"value": 0})["value"]:
                best[entry["index"]] = entry
    return sorted(best.values(), key=lambda entry: -entry["value"])[0]


def test_a_record_shows_its_tokens_and_labels_and_opens_its_prompt(workbench, page):
    workbench.api("POST", "/api/monitoring/reset")
    workbench.api(
        "PUT",
        "/api/monitoring",
        json={"enabled": False, "features": None, "top_k": 3, "positions": "all"},
    )
    page.goto(f"{workbench.url}#/monitoring")
    page.get_by_label("Token text").check()
    page.get_by_label("Feature labels").check()
    page.get_by_role("button", name="Save settings").click()
    page.get_by_role("button", name="Turn on").click()
    expect(page.get_by_test_id("monitoring-state")).to_have_text("on")
    settings = workbench.api("GET", "/api/monitoring").json()
    assert (settings["tokens"], settings["labels"]) == (True, True)
    expect(page.get_by_test_id("feed")).to_have_text("live")

    answer = generate(workbench, "Tell me about the river.")
    expect(page.get_by_test_id("points")).to_have_text("1 request")
    [record] = workbench.api("GET", "/api/monitoring/records?limit=1").json()["data"]
    assert record["request_id"] == answer["id"]
    row = (
        page.get_by_role("table", name="Latest records")
        .get_by_role("row")
        .filter(has=page.get_by_role("button", name=answer["id"]))
    )
    # the record's token text, prompt then answer (positions: all), and its strongest feature's
    # label
    expect(row.locator(".record-text")).to_have_text(
        "".join(position["token"] for position in record["positions"])
    )
    top = strongest(record)
    assert isinstance(top["label"], str)
    chip = row.locator(".chip").first
    expect(chip.get_by_role("link", name=f"#{top['index']}", exact=True)).to_be_visible()
    expect(chip).to_contain_text(top["label"])

    # its request id opens the prompt as the model read it, a chosen position marked in it
    row.get_by_role("button", name=answer["id"]).click()
    opened = page.get_by_role("region", name=f"Prompt of {answer['id']}")
    [prompt] = workbench.api("GET", f"/api/monitoring/requests/{answer['id']}").json()["prompts"]
    text = opened.get_by_role("group", name="Prompt text")
    expect(text).to_contain_text("Tell me about the river.")
    expect(opened).to_contain_text(f"{prompt['tokens']} tokens, {prompt['chars']} characters")
    river = next(
        position
        for position in record["positions"]
        if position["position"] < prompt["tokens"] and "river" in position["token"]
    )
    opened.get_by_label("Mark position").select_option(str(river["position"]))
    expect(text.locator("mark")).to_have_text(river["token"])
    expect(opened.get_by_test_id("marked-position")).to_contain_text(
        f"Position {river['position']}"
    )
    expect(opened.get_by_test_id("marked-position")).to_contain_text("in the prompt")

    # once the server forgets the request (a reset elsewhere), opening it says so
    opened.get_by_role("button", name="Close").click()
    workbench.api("POST", "/api/monitoring/reset")
    row.get_by_role("button", name=answer["id"]).click()
    expect(opened.get_by_role("alert")).to_contain_text(
        f"404 monitored_request_not_found: no monitored request '{answer['id']}' is kept"
    )
    expect(opened).to_contain_text("no longer keeps this request's prompt")
