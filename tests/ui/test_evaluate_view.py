"""The Evaluate view: an evaluation started from the page runs as a job to its end, and the result
shows as the API stores it: the ranking, a chart of the sweep, and the answers behind a point."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.api.clients import MODEL


def test_an_evaluation_started_here_shows_its_sweep_and_answers(workbench, page):
    page.goto(f"{workbench.url}#/evaluate")
    expect(page.get_by_role("status", name="Model state")).to_contain_text(f"{MODEL} · ready")
    form = page.get_by_role("form", name="New evaluation")
    form.get_by_label("Concept").fill("rivers")
    form.get_by_label("Feature").fill("3")
    form.get_by_label("Strengths").fill("0, 40")
    form.get_by_label("Instructions, one per line").fill(
        "Tell me about the city.\nDescribe your day."
    )
    form.get_by_label("Max tokens").fill("4")
    form.get_by_role("button", name="Start the evaluation").click()
    result = page.get_by_role("region", name="Evaluation: rivers")
    expect(result).to_be_visible(timeout=120_000)
    (stored,) = workbench.api("GET", "/api/evaluations").json()["data"]
    full = workbench.api("GET", f"/api/evaluations/{stored['id']}").json()
    ranking = result.get_by_role("table", name="Ranking").get_by_role("row")
    expect(ranking).to_have_count(1 + len(full["ranking"]))  # the heading row, then one per line
    expect(ranking.nth(1)).to_contain_text(full["ranking"][0]["label"])
    expect(
        result.get_by_role("img", name="Sweep chart of harmonic_mean").locator("canvas")
    ).to_have_count(1)
    feature = full["candidates"][0]
    result.get_by_role("button", name=f"Answers of {feature['label']} at 40").click()
    answers = result.get_by_role("region", name="Answers")
    samples = feature["points"][1]["samples"]
    expect(answers.locator("dl.sample")).to_have_count(len(samples))
    for shown, sample in zip(answers.locator("dl.sample").all(), samples, strict=True):
        # the instruction and the answer apart, not run together as one text
        instruction = full["instructions"][sample["instruction"]]
        expect(shown.locator("dt")).to_have_text(["Instruction", "Answer"])
        expect(shown.locator("dd").first).to_have_text(instruction)
        expect(shown.locator("dd.reply")).to_have_text(sample["text"].strip())
    result.get_by_label("Metric").select_option("concept")
    expect(result.get_by_role("img", name="Sweep chart of concept")).to_be_visible()
    page.get_by_role("button", name="Delete evaluation rivers").click()
    expect(page.get_by_role("region", name="Evaluations")).to_contain_text(
        "No evaluation is stored."
    )
