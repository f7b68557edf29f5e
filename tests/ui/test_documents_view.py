"""Profiles, clusters and circuits in the workbench: a profile file imported and activated, a
profile made in the form, edited, exported and deleted, a cluster's dial over its declared range,
a circuit's rung in the spec's words and whether it steers, and a bad import refused with the
API's message and nothing stored."""

from __future__ import annotations

import json
import os
from pathlib import Path

from playwright.sync_api import expect

from tests.support.mistudio_docs import circuit, cluster


def profile_document(sae: str, name: str) -> dict:
    return {
        "kind": "millm.profile",
        "version": 2,
        "name": name,
        "description": "rivers, gently",
        "steering": [
            {
                "sae_id": sae,
                "layer": 1,
                "features": [
                    {"index": 3, "op": "add", "strength": 12.0},
                    {"index": 30, "op": "add", "strength": -4.5},
                ],
            }
        ],
    }


def write(tmp_path: Path, name: str, doc) -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def names(workbench, plural: str) -> list[str]:
    return sorted(d["name"] for d in workbench.api("GET", f"/api/{plural}").json()["data"])


def open_view(workbench, page):
    page.goto(f"{workbench.url}#/documents")
    expect(page.get_by_role("status", name="Model state")).to_contain_text("ready")


def test_import_a_profile_file_and_activate_it(workbench, page, tmp_path):
    path = write(tmp_path, "river-run.profile.json", profile_document(workbench.sae, "river-run"))
    open_view(workbench, page)
    panel = page.get_by_role("region", name="Profiles")
    panel.get_by_label("Import a profile file").set_input_files(path)
    expect(panel.get_by_text("Imported river-run from river-run.profile.json.")).to_be_visible()
    row = (
        panel.get_by_role("table", name="Profiles").get_by_role("row").filter(has_text="river-run")
    )
    expect(row).to_contain_text("#3 +12")
    expect(row).to_contain_text("#30 −4.5")
    expect(row.locator("[data-active]")).to_have_text("inactive")

    row.get_by_role("button", name="Activate").click()
    expect(row.locator("[data-active]")).to_have_text("active")
    expect(page.get_by_label("Steering base now")).to_contain_text("The base is profile river-run")
    steering = workbench.api("GET", "/api/steering").json()
    assert steering["source"] == "profile" and steering["active_profile"]["name"] == "river-run"
    assert steering["active_base"]["fits"] is True
    listed = {p["name"]: p["active"] for p in workbench.api("GET", "/api/profiles").json()["data"]}
    assert listed["river-run"] is True

    row.get_by_role("button", name="Deactivate").click()
    expect(row.locator("[data-active]")).to_have_text("inactive")
    expect(page.get_by_label("Steering base now")).to_contain_text("The base is the live values")
    assert workbench.api("GET", "/api/steering").json()["source"] == "live"
    assert workbench.api("GET", "/api/profiles/river-run").json()["active"] is False


def test_create_edit_export_and_delete_a_profile(workbench, page):
    open_view(workbench, page)
    panel = page.get_by_role("region", name="Profiles")
    panel.get_by_role("button", name="New profile").click()
    form = panel.get_by_role("form", name="New profile")
    form.get_by_label("Name", exact=True).fill("made-here")
    form.get_by_label("Description", exact=True).fill("made in the form")
    first = form.get_by_role("group", name="Feature 1")
    first.get_by_label("Feature index").fill("5")
    first.get_by_label("Strength").fill("7.5")
    form.get_by_role("button", name="Add a feature").click()
    second = form.get_by_role("group", name="Feature 2")
    second.get_by_label("Feature index").fill("11")
    second.get_by_label("Operator").select_option("cap")
    second.get_by_label("Value").fill("3")
    form.get_by_role("button", name="Create profile").click()

    row = (
        panel.get_by_role("table", name="Profiles").get_by_role("row").filter(has_text="made-here")
    )
    expect(row).to_contain_text("#5 +7.5")
    expect(row).to_contain_text("#11 cap 3")
    expect(form).to_have_count(0)
    stored = workbench.api("GET", "/api/profiles/made-here").json()["document"]
    assert stored["description"] == "made in the form"
    assert stored["steering"] == [
        {
            "sae_id": workbench.sae,
            "layer": 1,
            "features": [
                {"index": 5, "op": "add", "strength": 7.5},
                {"index": 11, "op": "cap", "value": 3.0},
            ],
        }
    ]

    row.get_by_role("button", name="Edit").click()
    edit = panel.get_by_role("form", name="Edit profile made-here")
    expect(edit.get_by_role("group", name="Feature 1").get_by_label("Strength")).to_have_value(
        "7.5"
    )
    edit.get_by_role("group", name="Feature 1").get_by_label("Strength").fill("-20")
    edit.get_by_role("button", name="Save changes").click()
    expect(row).to_contain_text("#5 −20")
    features = workbench.api("GET", "/api/profiles/made-here").json()["document"]["steering"][0][
        "features"
    ]
    assert features == [
        {"index": 5, "op": "add", "strength": -20.0},
        {"index": 11, "op": "cap", "value": 3.0},
    ]

    with page.expect_download() as download:
        row.get_by_role("button", name="Export").click()
    assert download.value.suggested_filename == "made-here.profile.json"
    exported = json.loads(Path(download.value.path()).read_text())
    assert exported == workbench.api("GET", "/api/profiles/made-here/export").json()
    assert exported["steering"][0]["features"][0]["strength"] == -20.0

    with page.expect_download() as bundle:
        panel.get_by_role("button", name="Export all").click()
    everything = json.loads(Path(bundle.value.path()).read_text())
    assert everything == workbench.api("GET", "/api/profiles/export").json()
    assert "made-here" in [p["name"] for p in everything["profiles"]]

    row.get_by_role("button", name="Delete").click()
    row.get_by_role("button", name="Delete made-here?").click()
    expect(panel.get_by_text("Deleted made-here.")).to_be_visible()
    expect(row).to_have_count(0)
    assert workbench.api("GET", "/api/profiles/made-here").status_code == 404


def test_a_cluster_dial_spans_its_declared_range_and_a_circuit_shows_its_rung(
    workbench, page, tmp_path
):
    cluster_file = write(
        tmp_path, "ui-cluster.json", cluster(name="ui-cluster", intensity_range=[0.5, 1.5])
    )
    open_view(workbench, page)
    clusters = page.get_by_role("region", name="Clusters")
    clusters.get_by_label("Import a cluster file").set_input_files(cluster_file)
    row = (
        clusters.get_by_role("table", name="Clusters")
        .get_by_role("row")
        .filter(has_text="ui-cluster")
    )
    dial = row.get_by_role("slider", name="Intensity of ui-cluster")
    expect(dial).to_be_visible()  # the import has landed before the API is asked
    declared = workbench.api("GET", "/api/clusters/ui-cluster").json()["intensity_range"]
    assert declared == [0.5, 1.5]
    expect(dial).to_have_attribute("min", "0.5")
    expect(dial).to_have_attribute("max", "1.5")
    assert [float(dial.get_attribute("min")), float(dial.get_attribute("max"))] == declared
    expect(row).to_contain_text("declared range 0.5–1.5")

    dial.fill("0.8")  # as a drag ends: input, then change
    expect(row).to_contain_text("#3 +10 → +8")  # the list reloaded with the stored dial
    expect(row.get_by_label("Intensity of ui-cluster now")).to_have_text("0.8")
    assert workbench.api("GET", "/api/clusters/ui-cluster").json()["intensity"] == 0.8
    dial.focus()
    page.keyboard.press("ArrowRight")  # keyboard steps are stored too
    expect(row).to_contain_text("#3 +10 → +8.1")
    assert workbench.api("GET", "/api/clusters/ui-cluster").json()["intensity"] == 0.81

    row.get_by_role("button", name="Activate").click()
    expect(row.locator("[data-active]")).to_have_text("active")
    assert workbench.api("GET", "/api/steering").json()["source"] == "cluster"
    assert workbench.api("GET", "/api/clusters/ui-cluster").json()["active"] is True

    circuit_file = write(
        tmp_path,
        "ui-circuit.json",
        circuit(name="ui-circuit", layers=(1, 1), n_features=(128, 128)),
    )
    circuits = page.get_by_role("region", name="Circuits")
    circuits.get_by_label("Import a circuit file").set_input_files(circuit_file)
    crow = (
        circuits.get_by_role("table", name="Circuits")
        .get_by_role("row")
        .filter(has_text="ui-circuit")
    )
    expect(crow).to_have_count(1)  # the import has landed before the API is asked
    stored = workbench.api("GET", "/api/circuits/ui-circuit").json()
    assert (stored["rung"], stored["language"]) == (2, "causally validated (edge)")
    expect(crow.locator(".rung")).to_have_text("rung 2")
    expect(crow.locator(".rung-language")).to_have_text("causally validated (edge)")
    expect(crow).to_contain_text("Each edge causally validated")
    expect(page.get_by_label("Active circuit")).to_have_text("No circuit is active.")

    crow.get_by_role("button", name="Activate").click()
    expect(crow.locator("[data-active]")).to_have_text("active")
    # the cluster is no longer the base
    expect(row.locator("[data-active]")).to_have_text("inactive")
    active = page.get_by_label("Active circuit")
    expect(active.locator("[data-steering]")).to_have_text("steers now")
    expect(active).to_contain_text("mode full: every member layer is bound")
    expect(active).to_contain_text('X-miLLM-Circuit-Rung: 2;language="causally validated (edge)"')
    now = workbench.api("GET", "/api/circuits/active", params={"single": "true"}).json()
    assert now["circuit"]["name"] == "ui-circuit"
    assert (
        now["steering"]["steering"] is True
        and now["steering"]["mode"] == "full"
        and now["steering"]["rung_header"] is True
    )
    assert workbench.api("GET", "/api/steering").json()["source"] == "circuit"
    # the shot shows both panels from the top
    clusters.evaluate("section => section.scrollIntoView()")

    # below rung 2 the API wants an acknowledgement: refused (its message shown) until it is given
    weak_file = write(
        tmp_path,
        "weak.json",
        circuit(name="ui-weak", rungs=(0, 1), layers=(1, 1), n_features=(128, 128)),
    )
    circuits.get_by_label("Import a circuit file").set_input_files(weak_file)
    weak = (
        circuits.get_by_role("table", name="Circuits").get_by_role("row").filter(has_text="ui-weak")
    )
    expect(weak.locator(".rung-language")).to_have_text("associated")
    weak.get_by_role("button", name="Activate").click()
    expect(circuits.get_by_role("alert")).to_contain_text(
        "400 rung_not_acknowledged: circuit 'ui-weak' is at rung 0 (associated)"
    )
    assert (
        workbench.api("GET", "/api/circuits/active", params={"single": "true"}).json()["circuit"][
            "name"
        ]
        == "ui-circuit"
    )
    weak.get_by_label("Acknowledge rung 0: not causally validated").check()
    weak.get_by_role("button", name="Activate").click()
    # one circuit at a time on this server: refused, saying so, until the active one goes
    expect(circuits.get_by_role("alert")).to_contain_text("409 circuit_concurrency_disabled")
    circuits.get_by_role("row").filter(has_text="ui-circuit").get_by_role(
        "button", name="Deactivate"
    ).click()
    expect(page.get_by_label("Active circuit")).to_have_text("No circuit is active.")
    weak.get_by_role("button", name="Activate").click()
    expect(weak.locator("[data-active]")).to_have_text("active")
    held = workbench.api("GET", "/api/circuits/claims").json()["data"]
    table = circuits.get_by_role("table", name="Layer claims")
    expect(table.locator("tbody tr")).to_have_count(len(held))
    expect(table.locator("tbody tr").first).to_contain_text("ui-weak")
    expect(table.locator("tbody tr").first).to_contain_text("exclusive")
    if os.environ.get("MILLM_UI_SHOT"):
        page.screenshot(path=os.environ["MILLM_UI_SHOT"], full_page=True)
    expect(page.get_by_label("Active circuit")).to_contain_text("Active circuit: ui-weak")
    expect(page.get_by_label("Active circuit")).to_contain_text("rung 0 associated")

    weak.get_by_role("button", name="Deactivate").click()
    expect(page.get_by_label("Active circuit")).to_have_text("No circuit is active.")
    assert workbench.api("GET", "/api/steering").json()["source"] == "live"
    for plural, name in (
        ("clusters", "ui-cluster"),
        ("circuits", "ui-circuit"),
        ("circuits", "ui-weak"),
    ):
        assert workbench.api("DELETE", f"/api/{plural}/{name}").status_code == 200


def test_a_bad_import_shows_the_apis_message_and_changes_nothing(workbench, page, tmp_path):
    before = {plural: names(workbench, plural) for plural in ("profiles", "clusters", "circuits")}
    open_view(workbench, page)

    profiles = page.get_by_role("region", name="Profiles")
    too_strong = profile_document(workbench.sae, "too-strong")
    too_strong["steering"][0]["features"][0]["strength"] = 900
    profiles.get_by_label("Import a profile file").set_input_files(
        write(tmp_path, "too-strong.json", too_strong)
    )
    expect(profiles.get_by_role("alert")).to_have_text(
        "400 invalid_profile: invalid profile: steering[0].features[0].strength: Input should be "
        "less than or equal to 200, got 900"
    )

    clusters = page.get_by_role("region", name="Clusters")
    clusters.get_by_label("Import a cluster file").set_input_files(
        write(tmp_path, "empty.json", cluster(name="no-members", members=[{}]))
    )
    expect(clusters.get_by_role("alert")).to_contain_text(
        "400 invalid_document: invalid cluster definition: members[0].feature_idx: required"
    )

    circuits = page.get_by_role("region", name="Circuits")
    circuits.get_by_label("Import a circuit file").set_input_files(
        write(tmp_path, "not-json.json", "{not json")
    )
    expect(circuits.get_by_role("alert")).to_contain_text("400 ")

    assert {plural: names(workbench, plural) for plural in before} == before
    expect(
        profiles.get_by_role("table", name="Profiles")
        .get_by_role("row")
        .filter(has_text="too-strong")
    ).to_have_count(0)
