"""The workbench on a server with an API key and an admin key: without a key it asks for one and
shows the API's 401; with the API key it reads but a state change shows the admin-key refusal and
changes nothing; with the admin key it works. The key lives in the tab's session storage only."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.ui.conftest import start_workbench

API_KEY = "sk-ui-api-0123456789"
ADMIN_KEY = "sk-ui-admin-9876543210"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def keyed(tiny_dirs, tiny_sae, tmp_path_factory):
    bench = start_workbench(
        tiny_dirs,
        tmp_path_factory.mktemp("ui-keyed"),
        tiny_sae,
        env={"MILLM_API_KEY": API_KEY, "MILLM_ADMIN_KEY": ADMIN_KEY},
        key=ADMIN_KEY,
    )
    try:
        yield bench
    finally:
        bench.process.stop()


def use_key(page, key: str) -> None:
    page.get_by_label("Key for this server").fill(key)
    page.get_by_role("button", name="Use key").click()


def attached(keyed) -> bool:
    return keyed.api("GET", f"/api/saes/{keyed.sae}", headers=ADMIN).json()["attached"]


def test_without_a_key_the_page_asks_for_one(keyed, page):
    page.goto(f"{keyed.url}#/system")
    form = page.get_by_role("form", name="API key")
    expect(form.get_by_role("alert")).to_contain_text(
        "401 invalid_api_key: This route needs an API key"
    )
    expect(page.get_by_role("table", name="Registered SAEs")).to_have_count(0)


def test_the_api_key_reads_and_the_admin_key_changes_state(keyed, page):
    page.goto(f"{keyed.url}#/system")
    use_key(page, API_KEY)
    row = (
        page.get_by_role("table", name="Registered SAEs")
        .get_by_role("row")
        .filter(has_text=keyed.sae)
    )
    expect(row).to_contain_text("layer 1")
    row.get_by_role("button", name="Detach").click()
    refusal = (
        "401 invalid_api_key: This route changes server state and needs the admin key "
        "(MILLM_ADMIN_KEY)"
    )
    expect(page.get_by_role("form", name="API key").get_by_role("alert")).to_contain_text(refusal)
    expect(page.get_by_role("region", name="SAEs").get_by_role("alert")).to_contain_text(refusal)
    assert attached(keyed) is True
    use_key(page, ADMIN_KEY)
    row = (
        page.get_by_role("table", name="Registered SAEs")
        .get_by_role("row")
        .filter(has_text=keyed.sae)
    )
    row.get_by_role("button", name="Detach").click()
    expect(row.get_by_role("button", name="Attach")).to_be_visible()
    assert attached(keyed) is False
    row.get_by_role("button", name="Attach").click()
    expect(row.get_by_role("button", name="Detach")).to_be_visible()
    assert attached(keyed) is True
    # kept in this tab's session only: not in localStorage, and a new browser context starts without
    # it
    assert page.evaluate("sessionStorage.getItem('millm.key')") == ADMIN_KEY
    assert page.evaluate("localStorage.length") == 0


def test_a_wrong_key_is_refused_clearly(keyed, page):
    page.goto(f"{keyed.url}#/system")
    use_key(page, "sk-wrong")
    expect(page.get_by_role("form", name="API key").get_by_role("alert")).to_contain_text(
        "401 invalid_api_key: Incorrect API key provided."
    )
