"""The Inspect view: the top features of a text (and of the chat's conversation) as the API ranks
them, a feature's per-token heat map with the API's activations, the contrast of two sets of texts,
and an API refusal shown as its message."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.support.browser import SIZES

TEXT = "The river runs through Paris.\nBoats pass under  the bridges at dawn."
CONVERSATION = [
    {"role": "user", "content": "Tell me about the river in Paris."},
    {"role": "assistant", "content": "The Seine runs through Paris under many bridges."},
]
SET_A = [
    "The river runs through Paris.",
    "Boats sail down the river at dawn.",
    "The bridges of Paris cross the river.",
]
SET_B = [
    "I bought bread and cheese.",
    "The meeting is on Thursday.",
    "She repaired the old bicycle.",
    "Rain is expected tonight.",
]


def cells(table, column: int):
    """The cells of one column of a workbench table (body rows only)."""
    return table.locator(f"tbody tr td:nth-child({column})")


def numbers(locator) -> list[float]:
    """The numbers a list of cells shows."""
    return [float(text.replace("−", "-")) for text in locator.all_inner_texts()]


def inspect(workbench, body: dict) -> dict:
    """The API's inspect answer for `body`."""
    answer = workbench.api("POST", f"/api/saes/{workbench.sae}/inspect", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def assert_table_is(table, features: list[dict]) -> None:
    """The top features table shows these features in this order, with their figures."""
    expect(cells(table, 2)).to_have_text([f"#{f['index']}" for f in features])
    expect(cells(table, 3)).to_have_text([f["label"] for f in features])
    assert numbers(cells(table, 4)) == pytest.approx([f["max"] for f in features], rel=1e-3)
    assert numbers(cells(table, 5)) == pytest.approx(
        [f["mean"] for f in features], rel=1e-3, abs=1e-6
    )
    assert [int(n) for n in numbers(cells(table, 6))] == [f["count"] for f in features]


def test_top_features_and_the_heat_map_are_the_apis(workbench, page):
    page.goto(f"{workbench.url}#/inspect")
    page.get_by_label("Text to inspect").fill(TEXT)
    page.get_by_label("Features to list").fill("8")
    page.get_by_role("button", name="Inspect", exact=True).click()
    table = page.get_by_role("table", name="Top features")
    assert_table_is(
        table, inspect(workbench, {"text": TEXT, "top_k": 8, "sort": "max"})["features"]
    )

    # another order re-reads the same text
    page.get_by_label("Sort by").select_option("count")
    expected = inspect(workbench, {"text": TEXT, "top_k": 8, "sort": "count"})["features"]
    expect(page.get_by_role("status").filter(has_text="sorted by")).to_contain_text(
        "sorted by count"
    )
    assert_table_is(table, expected)

    # a feature's heat map: one span per read token, each with the API's activation
    chosen = expected[0]["index"]
    table.get_by_role("button", name=f"Heat map of #{chosen}").click()
    answer = inspect(workbench, {"text": TEXT, "top_k": 8, "sort": "count", "feature": chosen})
    values = answer["activations"]["values"]
    assert len(values) == len(answer["tokens"]) == answer["prompt_tokens"] - 1
    heat = page.get_by_role("group", name=f"Heat map of feature #{chosen}")
    spans = heat.locator(".tok")
    expect(spans).to_have_count(len(values))
    titles = spans.evaluate_all("spans => spans.map(s => s.title)")
    shown = [float(re.search(r" = (\S+)$", title).group(1)) for title in titles]
    assert shown == [v["value"] for v in values]
    peak = max(range(len(values)), key=lambda i: values[i]["value"])
    assert float(spans.nth(peak).get_attribute("aria-label").rsplit(": ", 1)[1]) == pytest.approx(
        values[peak]["value"], rel=1e-3
    )
    # white space is visible: the line break shows as ↵, and a token of spaces as dots
    breaks = [i for i, v in enumerate(values) if "\n" in v["token"]]
    assert breaks, [v["token"] for v in values]
    expect(spans.nth(breaks[0])).to_contain_text("↵")
    spaces = [i for i, v in enumerate(values) if v["token"].strip(" ") == "" and v["token"]]
    assert spaces
    for i in spaces:
        expect(spans.nth(i)).to_have_text("·" * len(values[i]["token"]))


def test_the_chats_conversation_is_inspected_as_messages(workbench, page):
    page.goto(f"{workbench.url}#/inspect")
    page.evaluate("c => sessionStorage.setItem('millm.conversation', c)", json.dumps(CONVERSATION))
    page.get_by_role("button", name="Use the chat's conversation").click()
    listed = page.get_by_role("list", name="Conversation to inspect").get_by_role("listitem")
    expect(listed).to_have_count(2)
    expect(listed.nth(1)).to_contain_text("The Seine runs through Paris")
    page.get_by_label("Features to list").fill("6")
    page.get_by_label("Sort by").select_option("mean")
    page.get_by_role("button", name="Inspect", exact=True).click()
    assert_table_is(
        page.get_by_role("table", name="Top features"),
        inspect(workbench, {"messages": CONVERSATION, "top_k": 6, "sort": "mean"})["features"],
    )


def test_without_a_conversation_the_page_says_so(workbench, page):
    page.goto(f"{workbench.url}#/inspect")
    page.get_by_role("button", name="Use the chat's conversation").click()
    expect(page.get_by_role("status").filter(has_text="no conversation")).to_be_visible()
    expect(page.get_by_label("Text to inspect")).to_be_visible()


def test_contrast_ranks_features_as_the_api_does(workbench, page):
    body = {"a": {"texts": SET_A}, "b": {"texts": SET_B}, "aggregate": "mean", "top_k": 10}
    answer = workbench.api("POST", f"/api/saes/{workbench.sae}/contrast", json=body)
    assert answer.status_code == 200, answer.text
    expected = answer.json()
    page.goto(f"{workbench.url}#/inspect")
    page.get_by_label("Set A").fill("\n".join(SET_A))
    page.get_by_label("Set B").fill("\n".join(SET_B) + "\n\n")  # blank lines are not texts
    page.get_by_label("A text's value").select_option("mean")
    page.get_by_label("Features per side").fill("10")
    page.get_by_role("button", name="Contrast", exact=True).click()
    for side, sign in (("a", 1), ("b", -1)):
        rows = expected[f"favouring_{side}"]
        table = page.get_by_role("table", name=f"Favouring {side.upper()}")
        expect(cells(table, 1)).to_have_text([f"#{f['index']}" for f in rows])
        for cell, f in zip(cells(table, 3).all_inner_texts(), rows, strict=True):
            if f["effect_size"] is None:
                assert cell == ("∞" if sign > 0 else "−∞")
            else:
                assert float(cell.replace("−", "-")) == pytest.approx(f["effect_size"], rel=1e-3)
        assert numbers(cells(table, 4)) == pytest.approx(
            [f["difference"] for f in rows], rel=1e-3, abs=1e-6
        )
        expect(cells(table, 6)).to_have_text([f"{f['fired_a']} / {f['fired_b']}" for f in rows])
    expect(page.get_by_role("status").filter(has_text="A: 3 texts")).to_contain_text("B: 4 texts")
    page.get_by_role("region", name="Contrast two sets of texts").evaluate(
        "panel => panel.scrollIntoView()"
    )


def test_a_refused_read_shows_the_apis_message(workbench, page):
    answer = workbench.api(
        "POST",
        f"/api/saes/{workbench.sae}/inspect",
        json={"text": TEXT, "top_k": 20, "sort": "max", "feature": 999},
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    page.goto(f"{workbench.url}#/inspect")
    page.get_by_label("Text to inspect").fill(TEXT)
    page.get_by_label("Heat map of feature", exact=True).fill("999")
    page.get_by_role("button", name="Inspect", exact=True).click()
    expect(page.get_by_role("region", name="Inspect a text").get_by_role("alert")).to_have_text(
        f"400 {error['code']}: {error['message']}"
    )


def test_a_text_read_under_a_profile_is_the_apis_steered_read(workbench, page):
    profile = {
        "name": "river-up",
        "steering": [
            {
                "sae_id": workbench.sae,
                "layer": 1,
                "features": [{"index": 5, "op": "add", "strength": 80}],
            }
        ],
    }
    assert workbench.api("POST", "/api/profiles", json=profile).status_code == 201
    try:
        steered = inspect(
            workbench, {"text": TEXT, "top_k": 6, "steering": {"profile": "river-up"}}
        )
        assert (
            steered["steered"]
            and steered["features"] != inspect(workbench, {"text": TEXT, "top_k": 6})["features"]
        )
        page.goto(f"{workbench.url}#/inspect")
        page.get_by_label("Text to inspect").fill(TEXT)
        page.get_by_label("Features to list").fill("6")
        page.get_by_label("Steering").select_option("profile:river-up")
        page.get_by_role("button", name="Inspect", exact=True).click()
        expect(page.get_by_role("status").filter(has_text="sorted by")).to_contain_text(
            "steered (profile river-up)"
        )
        assert_table_is(page.get_by_role("table", name="Top features"), steered["features"])
    finally:
        workbench.api("DELETE", "/api/profiles/river-up")


def on_page(token: str) -> str:
    """A token as the grid shows it: white space made visible when the token is nothing else."""
    return token.replace(" ", "·").replace("\n", "↵") if not token.strip() else token.strip()


def test_the_logit_lens_grid_shows_what_the_api_reads(workbench, page):
    page.goto(f"{workbench.url}#/inspect")
    form = page.get_by_role("form", name="Logit lens")
    form.get_by_label("Text").fill("The river runs")
    form.get_by_role("button", name="Read").click()
    grid = page.get_by_role("table", name="Logit lens")
    expect(grid).to_be_visible()
    lens = workbench.api("POST", "/api/lens", json={"text": "The river runs", "top_k": 3}).json()
    rows = grid.get_by_role("row")
    # the tokens, the model's row, one per block
    expect(rows).to_have_count(2 + len(lens["layers"]))
    last = lens["predictions"][-1]
    expect(rows.nth(1).get_by_role("cell").last).to_have_text(on_page(last["final"]["token"]))
    top_block = [c for c in last["layers"] if c["layer"] == lens["layers"][-1]][0]
    expect(rows.nth(2).get_by_role("cell").last).to_have_text(on_page(top_block["top"][0]["token"]))


def fits(page) -> bool:
    """Whether nothing on the page scrolls sideways at the narrow window's width."""
    return page.evaluate("document.documentElement.scrollWidth") <= SIZES["narrow"]["width"]


def test_at_420_px_nothing_on_the_inspect_tab_scrolls_sideways(workbench, page):
    """Every panel used, with a transcoder set registered (its long name widens the source picker,
    as the demo's set did): the text's features and heat map, the lens, a graph and an ablation."""
    from tests.support.server import TEST_ROOT
    from tests.support.tiny_transcoders import build_transcoder_set

    directory = build_transcoder_set(TEST_ROOT / "a-transcoder-set-with-a-long-name", seed=5)
    registered = workbench.api("POST", "/api/transcoders", json={"path": str(directory)}).json()
    try:
        page.set_viewport_size(SIZES["narrow"])
        page.goto(f"{workbench.url}#/inspect")
        expect(page.get_by_label("Feature source")).to_contain_text("a-transcoder-set-with-a-long")
        assert fits(page)
        page.get_by_label("Text to inspect").fill(TEXT)
        page.get_by_role("button", name="Inspect", exact=True).click()
        page.get_by_role("table", name="Top features").get_by_role("button").first.click()
        expect(page.get_by_role("group", name=re.compile("Heat map of feature"))).to_be_visible()
        page.get_by_role("form", name="Logit lens").get_by_role("button", name="Read").click()
        expect(page.get_by_role("table", name="Logit lens")).to_be_visible()
        form = page.get_by_role("form", name="Attribution graph")
        form.get_by_label("Text").fill("The river runs")
        form.get_by_label("Features expanded").fill("8")
        form.get_by_role("button", name="Trace").click()
        page.get_by_role("img", name="Attribution graph").locator("circle.feature").first.click()
        page.get_by_label("Node").get_by_label("ablate this feature").check()
        page.get_by_role("button", name="Ablate 1 feature (every position) and generate").click()
        expect(page.get_by_role("heading", name="ablated")).to_be_visible()
        assert fits(page)
    finally:
        workbench.api("DELETE", f"/api/transcoders/{registered['id']}")
