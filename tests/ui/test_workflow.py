"""The researcher's loop across the workbench's views, as the issue names it: search a feature by
label, steer it with the card's slider, and see in Compare that the steered answer differs from
the unsteered one (each equal to what /api/compare answers for the same body)."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.ui.test_chat_view import finished, open_chat, say

STRENGTH = 150


def test_search_steer_with_the_slider_and_compare(workbench, page):
    page.goto(f"{workbench.url}#/features")
    page.get_by_label("Search labels").fill("paris")
    page.get_by_role("button", name="Search", exact=True).click()
    results = page.get_by_role("table", name="Search results")
    expect(results.get_by_role("row").nth(1)).to_contain_text("feature 0 paris")
    results.get_by_role("link", name="#10", exact=True).click()
    card = page.get_by_role("region", name="Feature #10")
    expect(card).to_contain_text("feature 10 paris")
    # the range input, as a drag leaves it
    card.get_by_label("Steer #10", exact=True).fill(str(STRENGTH))
    expect(card.get_by_role("status").filter(has_text="Live:")).to_have_text(
        re.compile(rf"^Live: add {STRENGTH}\b")
    )
    live = workbench.api("GET", "/api/steering").json()
    assert [(f["index"], f["strength"]) for s in live["saes"] for f in s["features"]] == [
        (10, float(STRENGTH))
    ]
    try:
        open_chat(workbench, page, max_tokens=12, seed=5)
        page.get_by_role("switch", name="Compare").check()  # unsteered beside live, by default
        say(page, "Tell me about the river.")
        turn = finished(page.get_by_role("region", name="Comparison 1"))
        direct = workbench.api(
            "POST",
            "/api/compare",
            json={
                "messages": [{"role": "user", "content": "Tell me about the river."}],
                "max_tokens": 12,
                "temperature": 0,
                "seed": 5,
                "variants": ["unsteered", "live"],
            },
        ).json()["variants"]
        shown = {
            v["label"]: turn.get_by_role("article", name=v["label"], exact=True)
            .locator(".text")
            .text_content()
            for v in direct
        }
        assert shown == {v["label"]: v["text"] for v in direct}
        assert shown["unsteered"] != shown["live"]
    finally:
        workbench.api("DELETE", "/api/steering/features")
