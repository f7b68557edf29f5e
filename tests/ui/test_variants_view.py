"""Steered variants in the workbench: made from a saved profile in Models, SAEs & jobs, listed with
whether they fit, chosen in the chat as a model (its answer is the API's for that model name),
and deleted."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.api.clients import MODEL
from tests.ui.test_chat_view import finished, open_chat, say, value

USER = "Tell me about the river."


def test_a_variant_made_here_is_a_model_the_chat_can_pick(workbench, page):
    steering = [{"sae_id": workbench.sae, "layer": 1, "features": [{"index": 3, "strength": 60}]}]
    made = workbench.api("POST", "/api/profiles", json={"name": "loud", "steering": steering})
    assert made.status_code == 201, made.text
    page.goto(f"{workbench.url}#/system")
    form = page.get_by_role("form", name="New steered variant")
    form.get_by_label("Name").fill("loud-llama")
    form.get_by_label("Variant profile").select_option("loud")
    form.get_by_label("Intensity").fill("0.5")
    form.get_by_role("button", name=f"Create on {MODEL}").click()
    row = (
        page.get_by_role("table", name="Steered variants")
        .get_by_role("row")
        .filter(has_text="loud-llama")
    )
    expect(row).to_contain_text("profile loud @ 0.5")
    expect(row).to_contain_text("fits")
    listed = workbench.api("GET", "/v1/models").json()["data"]
    assert [card["parent"] for card in listed if card["id"] == "loud-llama"] == [MODEL]

    open_chat(workbench, page, max_tokens=8, seed=1)
    page.get_by_label("Steered by").select_option("model")
    page.get_by_label("Steered variant").select_option("loud-llama")
    say(page, USER)
    answer = finished(page.get_by_role("article", name="Answer 1"))
    direct = workbench.api(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "loud-llama",
            "messages": [{"role": "user", "content": USER}],
            "max_tokens": 8,
            "temperature": 0,
            "seed": 1,
        },
    )
    assert direct.status_code == 200, direct.text
    assert (
        answer.locator(".text").text_content() == direct.json()["choices"][0]["message"]["content"]
    )
    headers = answer.get_by_role("table", name="Response headers")
    expect(value(headers, "X-miLLM-Steering")).to_contain_text('variant="loud-llama"')

    page.goto(f"{workbench.url}#/system")
    page.get_by_role("button", name="Delete variant loud-llama").click()
    expect(page.get_by_role("region", name="Steered variants")).to_contain_text(
        "No steered variant exists."
    )
    assert workbench.api("GET", "/api/variants").json()["data"] == []
