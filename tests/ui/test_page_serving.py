"""How the workbench is served: linked from /, a strict Content-Security-Policy, vendored files
only (the page asks nothing of any other host), and every tab opens without a page error."""

from __future__ import annotations

import re

import httpx
from playwright.sync_api import expect

TABS = ["chat", "features", "inspect", "documents", "probes", "monitoring", "sensing", "evaluate",
        "dictionaries",
        "batches", "system"]  # fmt: skip


def test_the_landing_page_links_to_the_workbench(workbench):
    landing = httpx.get(f"{workbench.base_url}/", timeout=30)
    assert landing.status_code == 200 and landing.headers["content-type"].startswith("text/html")
    assert '<a href="/ui">Workbench</a>' in landing.text


def test_the_page_is_served_with_a_strict_policy(workbench):
    page = httpx.get(workbench.url, timeout=30)
    assert page.status_code == 200
    policy = page.headers["content-security-policy"]
    assert (
        "script-src 'self' 'sha256-" in policy
        and "connect-src 'self'" in policy
        and "unsafe-inline" not in policy
    )
    assert page.headers["cache-control"] == "no-cache"
    vendored = httpx.get(f"{workbench.base_url}/ui/assets/vendor/preact.mjs", timeout=30)
    assert vendored.status_code == 200 and "javascript" in vendored.headers["content-type"]
    assert httpx.get(f"{workbench.base_url}/ui/assets/nothing.js", timeout=30).status_code == 404


def test_every_tab_opens_and_asks_only_this_server(workbench, page):
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(workbench.url)
    for tab in TABS:
        page.get_by_role("navigation", name="Views").get_by_role("link").nth(
            TABS.index(tab)
        ).click()
        expect(page).to_have_url(re.compile(f"#/{tab}$"))
        expect(page.locator("main#view")).not_to_be_empty()
    foreign = [
        url
        for url in requested
        if not url.startswith(workbench.base_url) and not url.startswith("data:")
    ]
    assert requested and not foreign, foreign


def test_the_tabs_are_reachable_by_keyboard(workbench, page):
    page.goto(workbench.url)
    page.keyboard.press("Tab")  # the brand link
    for _ in range(12):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('href')") == "#/monitoring":
            break
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile("#/monitoring$"))
