"""Sensing in the workbench: a cluster's sensing switched on from its row, what is armed said,
and the events a chat records listed with the tokens around each, the span marked, as the API
stores them."""

from __future__ import annotations

import json
import os

from playwright.sync_api import expect

from tests.api.clients import MODEL
from tests.support.busy_features import busiest, sensed_cluster
from tests.ui.conftest import LAYER


def busy_cluster(bench) -> dict:
    """A cluster of the two features that fire most on a short completion, with their peaks."""
    doc = sensed_cluster(
        "busy-ui", LAYER, busiest(bench, bench.sae, "The river runs to the sea", 8)[:2]
    )
    imported = bench.api(
        "POST", "/api/clusters/import", content=json.dumps(doc),
        headers={"content-type": "application/json"}, params={"activate": "true"},
    )  # fmt: skip
    assert imported.status_code in (200, 201), imported.text
    return imported.json()["data"][0]


def test_a_cluster_sensed_from_the_page_lists_its_events_with_their_context(workbench, page):
    row = busy_cluster(workbench)
    page.goto(f"{workbench.url}#/sensing")
    panel = page.get_by_role("region", name="Clusters: co-activation")
    expect(panel.get_by_role("status").first).to_contain_text("Not armed")
    panel.get_by_role("button", name="Sense busy-ui").click()
    expect(panel.get_by_role("button", name="Stop sensing busy-ui")).to_have_text("On")
    expect(panel.get_by_role("status").first).to_contain_text("Sensing busy-ui at layer 1")
    assert (
        workbench.api("PUT", f"/api/sensing/{row['id']}/config", json={"min_k": 1}).status_code
        == 200
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "The river runs to the sea"}],
            "max_tokens": 12, "temperature": 0}  # fmt: skip
    answered = workbench.api("POST", "/v1/chat/completions", json=body).json()
    stored = workbench.api("GET", "/api/sensing/events", params={"cluster_id": row["id"]}).json()
    assert stored["total"] >= 1 and stored["data"][0]["request_id"] == answered["id"]
    table = panel.get_by_role("table", name="cluster sensing events")
    expect(table.locator("tbody tr")).to_have_count(stored["total"])  # the feed brought them
    newest = stored["data"][0]
    first = table.locator("tbody tr").first
    expect(first).to_contain_text(f"{newest['pos_start']}–{newest['pos_end']}")
    expect(first.locator("mark")).to_have_text(newest["context_parts"]["span"])
    if os.environ.get("MILLM_UI_SHOT"):
        page.screenshot(path=os.environ["MILLM_UI_SHOT"], full_page=True)
    panel.get_by_role("button", name="Stop sensing busy-ui").click()
    expect(panel.get_by_role("status").first).to_contain_text("Not armed")
    assert workbench.api("GET", "/api/sensing/status").json()["enabled_clusters"] == []
