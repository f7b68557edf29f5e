"""Models, SAEs and jobs in the workbench: the model's state, detach and attach, and a calibration
job started from the page whose progress bar reaches 100%."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.api.clients import MODEL

TEXTS = [f"The river {i} runs through Paris and meets the sea at dawn." for i in range(12)]


def test_the_page_shows_the_model_and_the_attached_sae(workbench, page):
    page.goto(f"{workbench.url}#/system")
    expect(page.get_by_role("status", name="Model state")).to_contain_text(f"{MODEL} · ready")
    models = page.get_by_role("table", name="Registered models")
    expect(models.get_by_role("row").filter(has_text=MODEL)).to_contain_text("loaded")
    saes = page.get_by_role("table", name="Registered SAEs")
    expect(saes.get_by_role("row").filter(has_text=workbench.sae)).to_contain_text("layer 1")


def test_detach_and_attach_go_through_the_api(workbench, page):
    page.goto(f"{workbench.url}#/system")
    row = (
        page.get_by_role("table", name="Registered SAEs")
        .get_by_role("row")
        .filter(has_text=workbench.sae)
    )
    row.get_by_role("button", name="Detach").click()
    expect(row.get_by_role("button", name="Attach")).to_be_visible()
    assert workbench.api("GET", f"/api/saes/{workbench.sae}").json()["attached"] is False
    row.get_by_role("button", name="Attach").click()
    expect(row.get_by_role("button", name="Detach")).to_be_visible()
    assert workbench.api("GET", f"/api/saes/{workbench.sae}").json()["attached"] is True


def test_a_calibration_started_here_reaches_100_percent(workbench, page):
    page.goto(f"{workbench.url}#/system")
    page.get_by_label("Texts, one per line").fill("\n".join(TEXTS))
    page.get_by_role("button", name=f"Calibrate on {len(TEXTS)} texts").click()
    # the server is shared with other modules' jobs: this one is the calibration over these texts
    job = (
        page.get_by_role("table", name="Jobs")
        .get_by_role("row")
        .filter(has_text=f"over {len(TEXTS)} texts")
    )
    expect(job.locator("[data-state]")).to_have_text("succeeded", timeout=120_000)
    expect(job).to_contain_text(f"{len(TEXTS)}/{len(TEXTS)} texts (100%)")
    expect(job.get_by_role("progressbar")).to_have_attribute("value", str(len(TEXTS)))
    stored = workbench.api("GET", f"/api/saes/{workbench.sae}/calibration").json()["summary"]
    assert stored["texts"] == len(TEXTS)


def test_a_refused_action_shows_the_apis_message(workbench, page):
    page.goto(f"{workbench.url}#/system")
    page.get_by_label("Register an SAE").fill("/nowhere/at/all")
    page.get_by_role("button", name="Register").last.click()
    alert = page.get_by_role("region", name="SAEs").get_by_role("alert")
    expect(alert).to_have_text(re.compile(r"^403 path_not_allowed: path '/nowhere/at/all' .+"))
    # not a key problem: no key form
    expect(page.get_by_role("form", name="API key")).to_have_count(0)


def test_autosteer_started_here_ends_with_its_verdict(workbench, page):
    page.goto(f"{workbench.url}#/system")
    page.get_by_label("Goal").fill("talk about paris")
    page.get_by_role("button", name="Start AutoSteer").click()
    job = page.get_by_role("table", name="Jobs").get_by_role("row").filter(has_text="autosteer")
    expect(job.locator("[data-state]")).to_have_text("succeeded", timeout=300_000)
    (listed,) = [
        j for j in workbench.api("GET", "/api/jobs").json()["data"] if j["kind"] == "autosteer"
    ]
    result = listed["result"]
    assert result["goal"] == "talk about paris" and result["sae_id"] == workbench.sae
    if result["best"]:
        expect(job).to_contain_text(f"best: #{result['best']['index']} at")
    else:
        expect(job).to_contain_text("no setting beat the unsteered answers")


def test_a_running_job_is_cancelled_from_the_page(workbench, page):
    texts = [
        f"Text number {i} about the river and the city of Paris, again and again." * 4
        for i in range(400)
    ]
    started = workbench.api("POST", f"/api/saes/{workbench.sae}/calibrate", json={"texts": texts})
    assert started.status_code == 202, started.text
    job_id = started.json()["id"]
    page.goto(f"{workbench.url}#/system")
    row = page.get_by_role("table", name="Jobs").get_by_role("row").filter(has_text=job_id)
    row.get_by_role("button", name="Cancel").click()
    expect(row.locator("[data-state]")).to_have_text("cancelled", timeout=60_000)
    assert workbench.api("GET", f"/api/jobs/{job_id}").json()["state"] == "cancelled"
    expect(row.get_by_role("button", name="Cancel")).to_have_count(0)
