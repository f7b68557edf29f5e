"""Probes in the workbench: a feature threshold probe made in the form (and one whose firing steers,
written as a profile's condition), activated and deactivated; a linear probe trained from example
texts, its job followed to the end; a probe file imported and exported; a bad import refused with
the API's message and nothing stored."""

from __future__ import annotations

import json
from pathlib import Path

from playwright.sync_api import expect

POSITIVE = [
    f"The river {i} floods the valley and the water rises over the banks." for i in range(4)
]
NEGATIVE = [f"Paris number {i} is a city of cafes, museums and long evenings." for i in range(4)]


def open_view(workbench, page):
    page.goto(f"{workbench.url}#/probes")
    expect(page.get_by_role("status", name="Model state")).to_contain_text("ready")


def probe_rows(page, name: str):
    table = page.get_by_role("region", name="Probes", exact=True).get_by_role(
        "table", name="Probes"
    )
    return table.get_by_role("row").filter(has=page.get_by_text(name, exact=True))


def probe_names(workbench) -> list[str]:
    return sorted(p["name"] for p in workbench.api("GET", "/api/probes").json()["data"])


def test_a_feature_threshold_probe_made_in_the_form(workbench, page):
    page.goto(f"{workbench.url}#/probes/{workbench.sae}/42")  # where a feature card links
    form = page.get_by_role("form", name="New feature probe")
    expect(form.get_by_label("Feature index", exact=True)).to_have_value("42")
    expect(form.get_by_label("SAE")).to_have_value(workbench.sae)
    form.get_by_label("Probe name").fill("river-3")
    form.get_by_label("Feature index", exact=True).fill("3")
    form.get_by_label("Activation threshold").fill("0.5")
    form.get_by_role("button", name="Create probe").click()
    expect(form.get_by_text("Created probe river-3.")).to_be_visible()

    row = probe_rows(page, "river-3")
    expect(row).to_contain_text(f"feature #3 of {workbench.sae}")
    expect(row).to_contain_text("fires at activation ≥ 0.5")
    expect(row).to_contain_text("report")
    stored = workbench.api("GET", "/api/probes/river-3").json()
    assert stored["document"]["detector"] == {
        "type": "feature",
        "sae_id": workbench.sae,
        "index": 3,
        "threshold": 0.5,
    }
    assert stored["active"] is False

    row.get_by_role("button", name="Activate").click()
    expect(row.locator("[data-active]")).to_have_text("every request")
    assert workbench.api("GET", "/api/probes/river-3").json()["active"] is True
    row.get_by_role("button", name="Deactivate").click()
    expect(row.locator("[data-active]")).to_have_text("when named")
    assert workbench.api("GET", "/api/probes/river-3").json()["active"] is False

    # a probe whose firing steers: the condition is a profile's `when` (a probe itself only reports)
    form.get_by_label("Probe name").fill("bend")
    form.get_by_label("Feature index", exact=True).fill("20")
    form.get_by_label("a calibrated percentile").check()
    form.get_by_label("Percentile (1–99)").fill("90")
    form.get_by_label("Action").select_option("steer")
    form.get_by_label("Steer feature index").fill("7")
    form.get_by_label("Strength").fill("12")
    form.get_by_label("For tokens").fill("5")
    form.get_by_role("button", name="Create probe").click()
    expect(form.get_by_text("Created probe bend, profile bend-steer.")).to_be_visible()
    expect(probe_rows(page, "bend")).to_contain_text("steer #7 for 5 tokens via profile bend-steer")
    assert workbench.api("GET", "/api/probes/bend").json()["document"]["detector"] == {
        "type": "feature",
        "sae_id": workbench.sae,
        "index": 20,
        "percentile": 90,
    }
    profile = workbench.api("GET", "/api/profiles/bend-steer").json()["document"]
    assert profile["steering"] == [
        {
            "sae_id": workbench.sae,
            "layer": 1,
            "features": [{"index": 7, "op": "add", "strength": 12.0}],
            "when": {"probe": "bend", "tokens": 5},
        }
    ]

    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Delete river-3?").click()
    expect(row).to_have_count(0)
    assert workbench.api("GET", "/api/probes/river-3").status_code == 404


def test_train_a_linear_probe_from_examples(workbench, page):
    open_view(workbench, page)
    form = page.get_by_role("form", name="Train a linear probe")
    form.get_by_label("Name of the trained probe").fill("river-talk")
    form.get_by_label("Positive examples").fill("\n".join(POSITIVE))
    form.get_by_label("Negative examples").fill("\n\n".join(NEGATIVE))  # blank lines are skipped
    form.get_by_role("button", name="Train on 4 + 4 texts").click()

    job = page.get_by_label("Training job")
    expect(job.locator("[data-state]")).to_have_text("succeeded", timeout=120_000)
    expect(job).to_contain_text("Stored as probe river-talk")
    metrics = job.get_by_label("Held-out metrics")
    expect(metrics).to_contain_text("held-out accuracy")
    expect(metrics).to_contain_text("6 to fit, 2 held out")
    expect(job).to_contain_text("8/8 texts (100%)")
    ended = workbench.api("GET", "/api/jobs").json()["data"]
    result = next(
        j for j in ended if j["kind"] == "probe-training" and "river-talk" in j["description"]
    )["result"]
    assert result["probe"]["name"] == "river-talk"

    row = probe_rows(page, "river-talk")
    expect(row).to_contain_text("linear at layer 1 (resid_post)")
    stored = workbench.api("GET", "/api/probes/river-talk").json()["document"]["detector"]
    assert stored["type"] == "linear" and stored["layer"] == 1 and stored["threshold"] == 0.5
    assert stored["training"]["positives"] == 4 and stored["training"]["negatives"] == 4
    assert stored["training"]["accuracy"] == result["metrics"]["accuracy"]
    expect(row.get_by_label("Training metrics")).to_contain_text("4 + 4, 2 held out")


def test_import_and_export_a_probe_file(workbench, page, tmp_path):
    doc = {
        "kind": "millm.probe",
        "version": 1,
        "name": "imported-paris",
        "description": "every tenth feature",
        "detector": {
            "type": "weighted",
            "sae_id": workbench.sae,
            "features": [{"index": 10, "weight": 1.0}, {"index": 20, "weight": 0.5}],
            "threshold": 2.0,
        },
    }
    path = tmp_path / "imported-paris.probe.json"
    path.write_text(json.dumps(doc))
    open_view(workbench, page)
    panel = page.get_by_role("region", name="Probes", exact=True)
    panel.get_by_label("Import a probe file").set_input_files(path)
    expect(
        panel.get_by_text("Imported imported-paris from imported-paris.probe.json (inactive).")
    ).to_be_visible()
    row = probe_rows(page, "imported-paris")
    expect(row).to_contain_text("weighted sum of 2 features")
    expect(row).to_contain_text("#20 ×0.5")
    assert workbench.api("GET", "/api/probes/imported-paris/export").json() == doc

    with page.expect_download() as download:
        row.get_by_role("button", name="Export").click()
    assert download.value.suggested_filename == "imported-paris.probe.json"
    assert json.loads(Path(download.value.path()).read_text()) == doc

    # the same file again: refused by default (the name is taken), renamed when asked
    panel.get_by_label("Import a probe file").set_input_files(path)
    expect(panel.get_by_role("alert")).to_contain_text("409 probe_exists")
    panel.get_by_label("On a name clash").select_option("rename")
    panel.get_by_label("Import a probe file").set_input_files(path)
    expect(probe_rows(page, "imported-paris-2")).to_have_count(1)
    assert "imported-paris-2" in probe_names(workbench)


def test_a_bad_probe_file_shows_the_apis_message_and_changes_nothing(workbench, page, tmp_path):
    before = probe_names(workbench)
    both = {
        "kind": "millm.probe",
        "version": 1,
        "name": "both-ways",
        "detector": {
            "type": "feature",
            "sae_id": workbench.sae,
            "index": 3,
            "threshold": 1.0,
            "percentile": 90,
        },
    }
    path = tmp_path / "both.json"
    path.write_text(json.dumps(both))
    open_view(workbench, page)
    panel = page.get_by_role("region", name="Probes", exact=True)
    panel.get_by_label("Import a probe file").set_input_files(path)
    expect(panel.get_by_role("alert")).to_contain_text("400 invalid_probe: invalid probe: detector")
    assert probe_names(workbench) == before
    expect(probe_rows(page, "both-ways")).to_have_count(0)
