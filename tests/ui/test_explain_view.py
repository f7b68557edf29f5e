"""Explaining features in the workbench: a batch job from the Features view with its progress bar
and outcome, the explanations on a feature's card with their detection and fuzzing scores as the
API has them, search by meaning's selector and the scores beside explained labels, and a card's
"explain it" with the served model (which, random-weight, may write no explanation: the reason
shows), a job that wrote nothing shown failed with its reasons, and a card naming the running job
that explains its feature.

The server has an explainer endpoint on 127.0.0.1 (tests/support/explainer_endpoint.py) and its
SAE's shipped labels cleared, so explained features are found by their explanation."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest
from playwright.sync_api import expect

from tests.support.explainer_endpoint import Explainer
from tests.ui.conftest import start_workbench

# Enough windows (32 tokens each) that the densest features have more than the 20 top ones the
# explainer reads, so held-out windows are left to score.
TEXTS = [
    f"The river {i} runs through Paris and meets the sea at dawn, past {i} bridges and old "
    f"towns, where boats {i} wait for the tide and the city wakes slowly to the bells."
    for i in range(30)
]


@pytest.fixture(scope="module")
def explaining(tiny_dirs, tiny_sae, tmp_path_factory):
    endpoint = Explainer()
    env = {"MILLM_EXPLAINER_BASE_URL": endpoint.url, "MILLM_EXPLAINER_MODEL": "fixed"}
    bench = start_workbench(tiny_dirs, tmp_path_factory.mktemp("ui-explain"), tiny_sae, env)
    bench.explainer = endpoint
    try:
        assert bench.api("DELETE", f"/api/saes/{bench.sae}/labels").status_code == 200
        started = bench.api("POST", f"/api/saes/{bench.sae}/calibrate", json={"texts": TEXTS})
        assert started.status_code == 202, started.text
        while bench.api("GET", f"/api/jobs/{started.json()['id']}").json()["state"] == "running":
            time.sleep(0.1)
        yield bench
    finally:
        bench.process.stop()
        endpoint.server.shutdown()


def test_a_batch_is_explained_with_progress_and_the_card_shows_the_scores(explaining, page):
    bench = explaining
    page.goto(f"{bench.url}#/features/{bench.sae}")
    form = page.get_by_role("form", name="Explain features")
    form.get_by_label("Explain the").fill("2")
    form.locator("select[name=explain-which]").select_option("densest")
    form.locator("select[name=explainer]").select_option("endpoint")
    form.get_by_role("button", name="Start").click()
    job = page.get_by_label("Explaining job")
    expect(job.locator("[data-state]")).to_have_text("succeeded", timeout=60_000)
    expect(job.locator(".progress")).to_contain_text("2/2 features (100%)")
    stored = bench.api("GET", f"/api/saes/{bench.sae}/explanations").json()
    assert len(stored) == 2
    flagged = sum(e["flagged"] for e in stored)
    expect(page.get_by_role("status").filter(has_text="explained")).to_have_text(
        f"2 explained, {flagged} flagged."
    )
    first = stored[0]
    page.goto(f"{bench.url}#/features/{bench.sae}/{first['feature']}")
    table = page.get_by_role("table", name="Explanations")
    expect(table.locator("tbody tr td").nth(0)).to_contain_text(first["explanation"])
    shown = float(table.locator("tbody tr td").nth(1).locator(".num").inner_text())
    assert shown == pytest.approx(first["detection"]["balanced_accuracy"], abs=0.01)
    expect(table.locator("tbody tr td").nth(2)).to_contain_text(
        f"({first['fuzzing']['texts']} texts)"
    )
    # Search: the explained features are found by their explanation, their score beside them.
    page.get_by_label("Search labels").fill("pattern")
    page.get_by_role("button", name="Search", exact=True).click()
    results = page.get_by_role("table", name="Search results")
    expect(results.locator("tbody tr")).to_have_count(2)
    expect(results.locator("tbody tr td:nth-child(6)")).to_have_text(["explained", "explained"])
    page.locator("select[name=by]").select_option("both")
    expect(page.get_by_role("table", name="Search results").locator("tbody tr")).to_have_count(2)
    if os.environ.get("MILLM_UI_SHOT"):
        page.goto(f"{bench.url}#/features/{bench.sae}/{first['feature']}")
        expect(page.get_by_role("table", name="Explanations")).to_be_visible()
        page.screenshot(path=os.environ["MILLM_UI_SHOT"], full_page=True)


def test_explaining_from_a_card_with_the_served_model_shows_what_it_stored(explaining, page):
    bench = explaining
    fired = [
        f["index"]
        for f in bench.api(
            "GET",
            f"/api/saes/{bench.sae}/calibration",
            params={"features": ",".join(map(str, range(128)))},
        ).json()["features"]
        if f["count"] > 0
    ]
    index = fired[-1]
    page.goto(f"{bench.url}#/features/{bench.sae}/{index}")
    page.get_by_role("button", name="Explain it with the served model").click()
    job = page.get_by_label("Explaining job")
    expect(job.locator("[data-state]")).to_have_text(re.compile("succeeded|failed"), timeout=60_000)
    ended = bench.api("GET", "/api/jobs").json()["data"][0]
    assert ended["kind"] == "explain"
    # The random-weight model writes something after "[EXPLANATION]:", or nothing: either shows,
    # and writing nothing fails the job, saying why.
    if ended["result"]["explained"]:
        assert ended["state"] == "succeeded"
        written = ended["result"]["explanations"][0]["explanation"]
        table = page.get_by_role("table", name="Explanations")
        expect(table.locator("tbody tr").filter(has_text="served:")).to_contain_text(written)
    else:
        assert ended["state"] == "failed"
        reason = ended["result"]["skipped"][0]["reason"]
        expect(job.get_by_role("alert")).to_have_text(
            f"nothing_explained: no explanation was written for feature {index}: {reason}"
        )
        expect(page.locator(".explanations ul.meta")).to_have_text(f"#{index}: {reason}")


def test_a_job_that_wrote_nothing_fails_and_a_card_shows_the_job_explaining_it(explaining, page):
    """While a batch job covers a feature, its card names the job; the explainer writing no
    explanation line for either feature ends the job failed, the reasons listed under it and in
    the jobs list, its progress counted in features."""
    bench = explaining
    stored = {e["feature"] for e in bench.api("GET", f"/api/saes/{bench.sae}/explanations").json()}
    fired = [
        f["index"]
        for f in bench.api(
            "GET",
            f"/api/saes/{bench.sae}/calibration",
            params={"features": ",".join(map(str, range(128)))},
        ).json()["features"]
        if f["count"] > 0 and f["index"] not in stored
    ][:2]
    bench.explainer.silent, bench.explainer.hold = True, threading.Event()
    try:
        body = {"features": fired, "explainer": "endpoint"}
        started = bench.api("POST", f"/api/saes/{bench.sae}/labels/explain", json=body).json()
        page.goto(f"{bench.url}#/features/{bench.sae}/{fired[1]}")
        card = page.get_by_role("region", name=f"Feature #{fired[1]}")
        note = card.get_by_role("status").filter(has_text="Being explained by job")
        expect(note).to_contain_text(f"job {started['id']} (explain 2 features of {bench.sae}")
        expect(note).to_contain_text("0/2 features done")
        expect(card.get_by_role("button", name="Explain it with the served model")).to_be_disabled()
        bench.explainer.hold.set()
        expect(note).to_have_count(0, timeout=60_000)
    finally:
        bench.explainer.silent, bench.explainer.hold = False, None
    ended = bench.api("GET", f"/api/jobs/{started['id']}").json()
    assert ended["state"] == "failed" and ended["error"]["code"] == "nothing_explained"
    reason = "the explainer's answer has no [EXPLANATION]: line"
    page.goto(f"{bench.url}#/system")
    row = page.get_by_role("table", name="Jobs").get_by_role("row").filter(has_text=started["id"])
    expect(row.locator("[data-state]")).to_have_text("failed")
    expect(row).to_contain_text("2/2 features (100%)")
    expect(row).to_contain_text(f"nothing_explained: {ended['error']['message']}")
    expect(row).to_contain_text("0 explained, 0 flagged, 2 skipped")
    expect(row.locator("li")).to_have_text([f"#{f}: {reason}" for f in fired])


def test_a_registered_model_is_offered_as_the_explainer(explaining, page, tiny_dirs):
    """A registered model that is not loaded is an explainer choice: the job started names it
    (the API tests follow such a job to its end; here it is cancelled)."""
    bench = explaining
    registered = bench.api("POST", "/api/models", json={"source": str(tiny_dirs["gemma2"])})
    assert registered.status_code in (200, 201), registered.text
    name = registered.json()["id"]
    page.goto(f"{bench.url}#/features/{bench.sae}")
    form = page.get_by_role("form", name="Explain features")
    form.get_by_label("Explain the").fill("1")
    form.locator("select[name=explain-which]").select_option("densest")
    form.locator("select[name=explainer]").select_option(
        label=f"{name} (loaded beside for the job)"
    )
    form.get_by_role("button", name="Start").click()
    expect(page.locator("strong").filter(has_text="explain 1 feature of")).to_contain_text(
        f"with model:{name}"
    )
    job = page.get_by_label("Explaining job")
    job.get_by_role("button", name="Cancel").click()
    expect(job.locator("[data-state]")).to_have_text("cancelled", timeout=60_000)
    ended = bench.api("GET", "/api/jobs").json()["data"][0]
    assert ended["kind"] == "explain" and ended["description"].endswith(f"with model:{name}")


def test_features_are_labelled_by_their_top_tokens_from_the_features_view(explaining, page):
    """The labels the panel makes are the route's (tests/api/test_top_token_labels_api.py checks
    them against the calibration); here, that the panel labels the unlabelled features and says
    what it did, and the search then finds a feature by a word of its new label."""
    bench = explaining
    before = bench.api("GET", f"/api/saes/{bench.sae}/labels").json()
    page.goto(f"{bench.url}#/features/{bench.sae}")
    form = page.get_by_role("form", name="Label by top tokens")
    expect(form.get_by_label("Over the labels features have")).not_to_be_checked()
    form.get_by_role("button", name="Label").click()
    status = page.get_by_role("status").filter(has_text="left as they were")
    expect(status).to_be_visible()
    after = bench.api("GET", f"/api/saes/{bench.sae}/labels").json()
    added = len(after) - len(before)
    assert added > 0 and all(after[k] == v for k, v in before.items())
    summary = bench.api("GET", f"/api/saes/{bench.sae}/calibration").json()["summary"]
    expect(status).to_have_text(
        f"{added} features labelled, {summary['d_sae'] - added} left as they were; "
        f"{len(after)} labels in all."
    )
    labelled = bench.api("GET", f"/api/saes/{bench.sae}/labels", params={"detail": "true"})
    index, entry = next((k, v) for k, v in labelled.json().items() if k not in before)
    page.get_by_label("Search labels").fill(entry["label"].split(" / ")[0])
    page.get_by_role("button", name="Search", exact=True).click()
    expect(page.get_by_role("table", name="Search results")).to_contain_text(entry["label"])
