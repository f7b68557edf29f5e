"""The bar under the header that says what steers every /v1 request now, on every tab: the live
features with their strengths and labels, or the active profile by name; Clear makes /v1 requests
unsteered; it follows the page's own changes at once and the API's within its poll; and the chat's
compare column names the live features a "live" variant ran with."""

from __future__ import annotations

from playwright.sync_api import expect

UNSTEERED = "Nothing steers /v1 requests: they are unsteered."


def nothing_live(workbench) -> bool:
    """Whether GET /api/steering says nothing steers /v1 requests: no live value, no active base."""
    state = workbench.api("GET", "/api/steering").json()
    return state["active_base"] is None and all(not s["features"] for s in state["saes"])


def test_a_live_feature_shows_on_every_tab_until_clear(workbench, page):
    sae = workbench.sae
    workbench.api("PUT", f"/api/steering/saes/{sae}/features/3", json={"strength": 43})
    workbench.api("PUT", f"/api/steering/saes/{sae}/features/7", json={"op": "clamp", "value": 2})
    page.goto(f"{workbench.url}#/chat")
    bar = page.get_by_role("region", name="What /v1 gets now")
    expect(bar).to_contain_text("Every /v1 request is steered live: #3 +43 feature 3 river")
    expect(bar).to_contain_text("#7 clamp 2")
    page.get_by_role("link", name="Inspect").click()
    expect(page.get_by_role("region", name="Inspect a text")).to_be_visible()
    expect(bar).to_contain_text("#3 +43")
    bar.get_by_role("button", name="Clear").click()
    expect(bar).to_have_text(UNSTEERED)
    expect(bar.get_by_role("button", name="Clear")).to_have_count(0)
    assert nothing_live(workbench)


def test_an_active_profile_is_named_and_clear_deactivates_it(workbench, page):
    sae = workbench.sae
    profile = {
        "name": "river-up",
        "steering": [{"sae_id": sae, "features": [{"index": 5, "strength": 30}]}],
    }
    assert workbench.api("POST", "/api/profiles", json=profile).status_code == 201
    try:
        workbench.api("POST", "/api/profiles/river-up/activate").raise_for_status()
        page.goto(f"{workbench.url}#/probes")
        bar = page.get_by_role("region", name="What /v1 gets now")
        expect(bar.get_by_role("status")).to_have_text(
            "Every /v1 request is steered by profile river-up."
        )
        bar.get_by_role("button", name="Clear").click()
        expect(bar).to_have_text(UNSTEERED)
        assert nothing_live(workbench)
    finally:
        workbench.api("DELETE", "/api/profiles/river-up")


def test_the_bar_follows_the_pages_changes_and_the_apis(workbench, page):
    sae = workbench.sae
    page.goto(f"{workbench.url}#/features/{sae}/12")
    bar = page.get_by_role("region", name="What /v1 gets now")
    expect(bar).to_have_text(UNSTEERED)
    number = page.get_by_role("region", name="Feature #12").get_by_label(
        "Strength of #12", exact=True
    )
    number.fill("-20")
    number.press("Enter")
    expect(bar).to_contain_text("#12 -20", timeout=3_000)  # refreshed after the change, not polled
    workbench.api("DELETE", "/api/steering/features").raise_for_status()  # another client
    expect(bar).to_have_text(UNSTEERED, timeout=12_000)  # within the poll


def test_the_compare_column_names_the_live_features_it_ran_with(workbench, page):
    workbench.api("PUT", f"/api/steering/saes/{workbench.sae}/features/3", json={"strength": 43})
    try:
        page.goto(f"{workbench.url}#/chat")
        page.get_by_label("Max tokens").fill("4")
        page.get_by_role("switch", name="Compare").check()  # unsteered beside live, the default
        page.get_by_label("Message").fill("Where does the river go?")
        page.get_by_role("button", name="Compare 2").click()
        live = page.get_by_role("region", name="Comparison 1").get_by_role(
            "article", name="live", exact=True
        )
        expect(live.get_by_role("heading")).to_have_text("live · #3 +43")
        applied = live.get_by_role("table", name="Steering applied")
        expect(applied.get_by_role("row").filter(has_text="features")).to_have_text(
            "features#3 +43"
        )
        version = workbench.api("GET", "/api/steering").json()["version"]
        expect(applied.get_by_role("row").filter(has_text="version")).to_have_text(
            f"version{version}"
        )
    finally:
        workbench.api("DELETE", "/api/steering/features")
