"""Dictionaries in the workbench: an SAE trained from the form (its progress, curves and where it
was saved, as the API stores them), and its grade card beside the attached SAE's, side by side."""

from __future__ import annotations

import os

from playwright.sync_api import expect

from tests.ui.conftest import LAYER

TEXTS = "\n\n".join(
    f"The river runs to the sea past the old mill number {i}, and the boats go down with it."
    for i in range(200)
)


def test_an_sae_trained_from_the_form_is_graded_beside_the_attached_one(workbench, page):
    page.goto(f"{workbench.url}#/dictionaries")
    form = page.get_by_label("Train a dictionary")
    form.get_by_label("Layer", exact=True).fill(str(LAYER))
    form.get_by_label("Latents", exact=True).fill("64")
    form.get_by_label("k", exact=True).fill("4")
    form.get_by_label("Tokens", exact=True).fill("2048")
    form.get_by_label("Batch", exact=True).fill("256")
    form.get_by_label("Learning rate").fill("0.01")
    form.get_by_label("Corpus source").select_option("texts")
    form.get_by_label("Corpus: texts").fill(TEXTS)
    form.get_by_label("Calibrate and label it").check()  # on the corpus's texts: none given
    form.get_by_role("button", name="Train").click()
    training = page.get_by_label("Training", exact=True)
    expect(training.locator("[data-state]")).to_have_text("succeeded", timeout=120_000)
    stored = workbench.api("GET", "/api/saes/trainings").json()["data"][0]
    assert stored["state"] == "succeeded" and stored["progress"]["steps"] == 8
    assert stored["request"]["lr"] == 0.01 and stored["request"]["k"] == 4
    sae = stored["result"]["sae_id"]
    expect(training.get_by_role("status")).to_contain_text(f"Saved as {sae}")
    # calibrated on the 200 corpus texts, then labelled by the calibration's top tokens
    result = stored["result"]
    assert [result[step]["state"] for step in ("grade", "calibration", "labels")] == [
        "succeeded"
    ] * 3
    calibration = workbench.api("GET", f"/api/saes/{sae}/calibration").json()["summary"]
    assert calibration["texts"] == 200 and calibration["top_examples"] == 20
    labelled = workbench.api("GET", f"/api/saes/{sae}/features", params={"q": ""}).json()
    assert labelled["labels"] == result["labels"]["imported"] == calibration["features_fired"] > 0
    expect(training.get_by_label("Follow-ups")).to_have_text(
        "Then: grade succeeded, calibration succeeded, labels succeeded."
    )
    expect(training.get_by_role("img", name="Training curves").locator("canvas")).to_have_count(2)
    expect(training.get_by_role("button", name="Cancel")).to_have_count(0)
    trainings = page.get_by_role("table", name="Trainings")
    expect(trainings.locator("tbody tr").first).to_contain_text(sae)

    # the trained SAE is attached and was graded in the same job: its card beside the tiny SAE's
    grades = page.get_by_role("region", name="Grades: two dictionaries side by side")
    grades.get_by_label("Graded dictionary 1").select_option(workbench.sae)
    grades.get_by_label("Graded dictionary 2").select_option(sae)
    grades.get_by_label("Grade on: texts").fill(TEXTS)
    grades.get_by_role("button", name=f"Grade {workbench.sae}").click()
    expect(grades.locator("[data-state]")).to_have_text("succeeded", timeout=120_000)
    table = grades.get_by_role("table", name="Grade cards")
    for sae_id in (workbench.sae, sae):
        card = workbench.api("GET", f"/api/saes/{sae_id}/grades").json()["data"][0]
        column = [workbench.sae, sae].index(sae_id) + 2
        l0 = table.locator("tbody tr").filter(has_text="L0").locator(f"td:nth-child({column})")
        shown = float(f"{card['figures']['l0']:.3g}")  # three significant digits, as num() shows
        expect(l0).to_have_text(f"{shown:g}")
    if os.environ.get("MILLM_UI_SHOT"):
        page.screenshot(path=os.environ["MILLM_UI_SHOT"], full_page=True)
    # the SAE's page (Models, SAEs & jobs) shows its newest card in a line
    page.goto(f"{workbench.url}#/system")
    line = page.get_by_role("link", name=f"Grade of {sae}")
    expect(line).to_contain_text("variance explained")
    expect(line).to_have_attribute("href", "#/dictionaries")
    assert workbench.api("POST", f"/api/saes/{sae}/detach").status_code == 200
    assert workbench.api("DELETE", f"/api/saes/{sae}").status_code == 200


def test_a_transcoder_set_trained_from_the_form_is_registered_for_graphs(workbench, page):
    page.goto(f"{workbench.url}#/dictionaries")
    form = page.get_by_label("Train a dictionary")
    form.get_by_role("combobox", name="Dictionary").select_option("transcoder_set")
    expect(form.get_by_label("Layer", exact=True)).to_have_count(0)  # every block
    architectures = form.get_by_label("Architecture").locator("option")
    expect(architectures).to_have_text(["BatchTopK", "JumpReLU"])
    form.get_by_label("Skip connection").check()
    expect(form.get_by_label("Calibrate and label it")).to_have_count(0)  # nothing to attach
    form.get_by_label("Latents", exact=True).fill("32")
    form.get_by_label("k", exact=True).fill("4")
    form.get_by_label("Tokens", exact=True).fill("2048")
    form.get_by_label("Batch", exact=True).fill("256")
    form.get_by_label("Corpus source").select_option("texts")
    form.get_by_label("Corpus: texts").fill(TEXTS)
    form.get_by_role("button", name="Train").click()
    training = page.get_by_label("Training", exact=True)
    expect(training.locator("[data-state]")).to_have_text("succeeded", timeout=120_000)
    stored = workbench.api("GET", "/api/saes/trainings").json()["data"][0]
    request = stored["request"]
    assert request["kind"] == "transcoder_set" and request["skip"] is True
    assert request["architecture"] == "batchtopk" and request["layer"] is None
    found = stored["result"]["transcoder_set_id"]
    expect(training.get_by_role("status")).to_contain_text(
        f"Saved as {found} in {stored['result']['path']} and registered for attribution graphs"
    )
    row = page.get_by_role("table", name="Trainings").locator("tbody tr").first
    expect(row).to_contain_text("a transcoder per block")
    expect(row).to_contain_text(found)
    assert workbench.api("GET", f"/api/transcoders/{found}").json()["architecture"] == "jumprelu"

    # graded beside the attached SAE: its blocks' mean figures, its replacement model's CE
    grades = page.get_by_role("region", name="Grades: two dictionaries side by side")
    grades.get_by_label("Graded dictionary 1").select_option(workbench.sae)
    grades.get_by_label("Graded dictionary 2").select_option(found)
    grades.get_by_label("Grade on: texts").fill(TEXTS)
    grades.get_by_role("button", name=f"Grade {found}").click()
    expect(grades.locator("[data-state]")).to_have_text("succeeded", timeout=120_000)
    card = workbench.api("GET", f"/api/transcoders/{found}/grades").json()["data"][0]
    table = grades.get_by_role("table", name="Grade cards")
    for figure, key in (("L0", "mean_l0"), ("CE spliced", "ce_loss_spliced")):
        cell = table.locator("tbody tr").filter(has_text=figure).locator("td:nth-child(3)")
        shown = float(f"{card['figures'][key]:.3g}")  # three significant digits, as num() shows
        expect(cell).to_have_text(f"{shown:g}")
    expect(grades).to_contain_text("its blocks' means")
    assert workbench.api("DELETE", f"/api/transcoders/{found}").status_code == 200
