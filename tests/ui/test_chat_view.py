"""Chat & compare in the workbench: a streamed chat turn equal to the same request made through the
API, with its X-miLLM-* headers; a comparison of unsteered against a feature variant equal to what
/api/compare answers; probe verdicts and an abort probe's content_filter; API errors as messages;
Stop and New conversation."""

from __future__ import annotations

import json
import re

from playwright.sync_api import TimeoutError as PlaywrightTimeout
from playwright.sync_api import expect

from tests.api.clients import MODEL
from tests.support.browser import SIZES


def open_chat(workbench, page, *, max_tokens: int, seed: int | None = None):
    """The chat view with greedy sampling, `max_tokens` and `seed` set."""
    page.goto(f"{workbench.url}#/chat")
    expect(page.get_by_role("status", name="Model state")).to_contain_text(f"{MODEL} · ready")
    page.get_by_label("Max tokens").fill(str(max_tokens))
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Seed").fill("" if seed is None else str(seed))


def say(page, text: str) -> None:
    box = page.get_by_role("textbox", name="Message")
    box.fill(text)
    box.press("Enter")


def value(table, name: str):
    """The value cell of the row `name` in a name/value table (Response headers, Steering
    applied)."""
    return (
        table.get_by_role("row")
        .filter(has=table.page.get_by_role("rowheader", name=name, exact=True))
        .get_by_role("cell")
    )


def conversation(page) -> list[dict]:
    return json.loads(page.evaluate("sessionStorage.getItem('millm.conversation')"))


def expect_conversation(page, expected: list[dict]) -> None:
    """Wait until this tab's stored conversation is `expected`: the page saves it in an effect,
    after the render a locator sees, so reading it at once can race the save."""
    try:
        page.wait_for_function(
            "want => JSON.stringify(JSON.parse(sessionStorage.getItem('millm.conversation') || "
            "'null')) === JSON.stringify(want)",
            arg=expected,
            timeout=5_000,
        )
    except PlaywrightTimeout:
        assert conversation(page) == expected  # the difference, as pytest shows it


def finished(locator, timeout_ms: int = 60_000):
    """The locator once its turn has stopped streaming."""
    expect(locator).to_have_attribute("aria-busy", "false", timeout=timeout_ms)
    return locator


def firing_in_the_answer(
    workbench, messages: list[dict], max_tokens: int
) -> tuple[int, int, float]:
    """A feature of the tiny SAE that is silent over the prompt and fires in the greedy answer:
    (index, first position, its activation there), read where probes read (before steering)."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_sae_activations": {"positions": "all", "top_k": 8, "read_point": "pre_steering"},
    }
    answer = workbench.api("POST", "/v1/chat/completions", json=body).json()
    prompt = answer["usage"]["prompt_tokens"]
    seen_in_prompt: set[int] = set()
    first: dict[int, tuple[int, float]] = {}
    for entry in answer["millm"]["sae_activations"]["positions"]:
        if entry["position"] == 0:
            continue  # never scored by a probe (the attention sink)
        for feature in entry["features"]:
            if feature["value"] <= 0:
                continue
            if entry["position"] < prompt:
                seen_in_prompt.add(feature["index"])
            elif feature["index"] not in seen_in_prompt:
                first.setdefault(feature["index"], (entry["position"], feature["value"]))
    candidates = sorted(
        (position, index, activation)
        for index, (position, activation) in first.items()
        if index not in seen_in_prompt
    )
    assert candidates, "no feature fires in the answer only"
    position, index, activation = candidates[len(candidates) // 2]
    assert position > prompt  # a few tokens into the answer, not its first
    return index, position, activation


def test_a_chat_turn_streams_the_apis_answer_and_shows_its_headers(workbench, page):
    open_chat(workbench, page, max_tokens=12, seed=7)
    say(page, "Tell me about the river.")
    answer = finished(page.get_by_role("article", name="Answer 1"))

    messages = [{"role": "user", "content": "Tell me about the river."}]
    direct = workbench.api(
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 0, "seed": 7},
    )
    choice, usage = direct.json()["choices"][0], direct.json()["usage"]
    text = choice["message"]["content"]
    assert text
    assert answer.locator(".text").text_content() == text
    expect(answer).to_contain_text(
        f"finish_reason: {choice['finish_reason']} · {usage['prompt_tokens']} prompt + "
        f"{usage['completion_tokens']} completion tokens"
    )

    headers = answer.get_by_role("table", name="Response headers")
    expect(value(headers, "X-miLLM-Seed")).to_have_text('7;scope="request"')
    expect(value(headers, "X-miLLM-Steering")).to_have_text(direct.headers["x-millm-steering"])
    expect(value(headers, "X-miLLM-Ignored-Fields")).to_contain_text("not sent")
    expect(value(headers, "X-miLLM-Circuit-Rung")).to_contain_text("not sent")
    expect_conversation(page, [*messages, {"role": "assistant", "content": text}])

    # the conversation survives a reload (this tab's session), and a new one starts empty
    page.reload()
    expect(page.get_by_role("article", name="Answer 1").locator(".text")).to_have_text(text)
    page.get_by_role("button", name="New conversation").click()
    expect(page.get_by_role("article")).to_have_count(0)
    expect_conversation(page, [])

    # the same question again: the server's prefix cache supplies most of the prompt, and the turn
    # says how much
    say(page, "Tell me about the river.")
    again = finished(page.get_by_role("article", name="Answer 1"))
    expect(again).to_contain_text(re.compile(rf"{usage['prompt_tokens']} prompt \(\d+ cached\) \+"))
    cached = int(re.search(r"\((\d+) cached\)", again.text_content()).group(1))
    assert 0 < cached < usage["prompt_tokens"] and cached % 16 == 0


def test_compare_shows_unsteered_beside_a_feature_variant_as_the_api_answers(workbench, page):
    open_chat(workbench, page, max_tokens=16, seed=3)
    page.get_by_role("switch", name="Compare").check()
    variant = page.get_by_role("group", name="Variant 2")
    variant.get_by_role("combobox", name="Steered by").select_option("features")
    variant.get_by_label("Features").fill("5:200")
    say(page, "Where does the river go?")
    turn = finished(page.get_by_role("region", name="Comparison 1"))

    messages = [{"role": "user", "content": "Where does the river go?"}]
    direct = workbench.api(
        "POST",
        "/api/compare",
        json={
            "messages": messages,
            "max_tokens": 16,
            "temperature": 0,
            "seed": 3,
            "variants": [
                "unsteered",
                {"features": [{"sae_id": workbench.sae, "index": 5, "strength": 200}]},
            ],
        },
    )
    unsteered, steered = direct.json()["variants"]
    assert (unsteered["label"], steered["label"]) == ("unsteered", "features 5:+200")
    assert unsteered["text"] != steered["text"]
    for answer in (unsteered, steered):
        shown = turn.get_by_role("article", name=answer["label"], exact=True)
        assert shown.locator(".text").text_content() == answer["text"]
        expect(value(shown.get_by_role("table", name="Steering applied"), "kind")).to_have_text(
            answer["steering"]["kind"]
        )
    applied = turn.get_by_role("article", name="features 5:+200").get_by_role(
        "table", name="Steering applied"
    )
    expect(value(applied, "features")).to_have_text("#5 +200")
    expect(value(applied, "scope")).to_have_text("request")

    headers = turn.get_by_role("table", name="Response headers")
    expect(value(headers, "X-miLLM-Steering")).to_have_text("compare;variants=2")
    expect(value(headers, "X-miLLM-Seed")).to_have_text(direct.headers["x-millm-seed"])
    expect(turn).to_contain_text("/api/compare does not run probes")
    expect_conversation(page, [*messages, {"role": "assistant", "content": unsteered["text"]}])


def test_an_active_probe_shows_its_verdict_and_where_it_fired(workbench, page):
    messages = [{"role": "user", "content": "Name a city by the sea."}]
    index, position, activation = firing_in_the_answer(workbench, messages, 16)
    probe = {
        "name": "tiny-fires",
        "detector": {
            "type": "feature",
            "sae_id": workbench.sae,
            "index": index,
            "threshold": activation / 2,
        },
    }
    assert workbench.api("POST", "/api/probes", json=probe).status_code == 201
    assert workbench.api("POST", "/api/probes/tiny-fires/activate").status_code == 200
    try:
        open_chat(workbench, page, max_tokens=16)
        expect(page.get_by_role("group", name="Probes on this chat")).to_contain_text(
            "Active (watch every request): tiny-fires"
        )
        say(page, messages[0]["content"])
        answer = finished(page.get_by_role("article", name="Answer 1"))
        direct = workbench.api(
            "POST",
            "/v1/chat/completions",
            json={"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0},
        ).json()
        (verdict,) = direct["millm"]["probes"]
        assert (
            verdict["fired"]
            and verdict["first_position"] == position
            and verdict["source"] == "active"
        )
        prompt = direct["usage"]["prompt_tokens"]

        row = (
            answer.get_by_role("table", name="Probe verdicts")
            .get_by_role("row")
            .filter(has_text="tiny-fires")
        )
        expect(row).to_contain_text("active")
        expect(row).to_contain_text("report")
        expect(row).to_contain_text("fired")
        first = (
            f"position {position} (answer token {position - prompt + 1}) "
            f"{json.dumps(verdict['tokens'][0]['text'], ensure_ascii=False)}"
        )
        expect(row.get_by_role("listitem").first).to_have_text(first)
        expect(row.get_by_role("listitem")).to_have_count(
            min(len(verdict["positions"]), 8) + (len(verdict["positions"]) > 8)
        )
        assert answer.locator(".text").text_content() == direct["choices"][0]["message"]["content"]
    finally:
        workbench.api("DELETE", "/api/probes/tiny-fires")


def test_an_abort_probe_ends_the_answer_with_content_filter(workbench, page):
    messages = [{"role": "user", "content": "Tell me a story about a boat."}]
    index, position, activation = firing_in_the_answer(workbench, messages, 20)
    probe = {
        "name": "boat-stop",
        "detector": {
            "type": "feature",
            "sae_id": workbench.sae,
            "index": index,
            "threshold": activation / 2,
        },
    }
    assert workbench.api("POST", "/api/probes", json=probe).status_code == 201
    profile = {"name": "stop-at-boat", "steering": [], "abort": [{"probe": "boat-stop"}]}
    assert workbench.api("POST", "/api/profiles", json=profile).status_code == 201
    try:
        open_chat(workbench, page, max_tokens=20)
        steering = page.get_by_role("group", name="Steering of this chat")
        steering.get_by_role("combobox", name="Steered by").select_option("profile")
        steering.get_by_role("combobox", name="Profile").select_option("stop-at-boat")
        say(page, messages[0]["content"])
        answer = finished(page.get_by_role("article", name="Answer 1"))

        direct = workbench.api(
            "POST",
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": messages,
                "max_tokens": 20,
                "temperature": 0,
                "profile": "stop-at-boat",
            },
        )
        choice, prompt = direct.json()["choices"][0], direct.json()["usage"]["prompt_tokens"]
        assert choice["finish_reason"] == "content_filter"
        assert answer.locator(".text").text_content() == choice["message"]["content"]
        (verdict,) = direct.json()["millm"]["probes"]
        assert verdict["action"] == "abort" and verdict["acted_at"] == position

        note = answer.get_by_role("note")
        expect(note).to_contain_text("finish_reason: content_filter")
        expect(note).to_contain_text(
            f"ended by the abort probe boat-stop at position {position} (answer token "
            f"{position - prompt + 1})"
        )
        expect(
            value(answer.get_by_role("table", name="Response headers"), "X-miLLM-Steering")
        ).to_have_text(direct.headers["x-millm-steering"])
        row = (
            answer.get_by_role("table", name="Probe verdicts")
            .get_by_role("row")
            .filter(has_text="boat-stop")
        )
        expect(row).to_contain_text("abort")
        expect(row).to_contain_text(f"ended the answer at position {position}")

        # on a narrow window the answer, its headers and verdicts fit without a sideways scroll
        page.set_viewport_size(SIZES["narrow"])
        expect(note).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= SIZES["narrow"]["width"]
    finally:
        workbench.api("DELETE", "/api/profiles/stop-at-boat")
        workbench.api("DELETE", "/api/probes/boat-stop")


def test_api_errors_are_shown_as_the_apis_messages(workbench, page):
    # a profile deleted after the page listed it: /api/compare's 404 for that variant
    profile = {
        "name": "gone-soon",
        "steering": [{"sae_id": workbench.sae, "features": [{"index": 3, "strength": 10}]}],
    }
    assert workbench.api("POST", "/api/profiles", json=profile).status_code == 201
    open_chat(workbench, page, max_tokens=8)
    page.get_by_role("switch", name="Compare").check()
    variant = page.get_by_role("group", name="Variant 2")
    variant.get_by_role("combobox", name="Steered by").select_option("profile")
    variant.get_by_role("combobox", name="Profile").select_option("gone-soon")
    assert workbench.api("DELETE", "/api/profiles/gone-soon").status_code == 200
    say(page, "Hello")
    body = {
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 8,
        "temperature": 0,
        "variants": ["unsteered", {"profile": "gone-soon"}],
    }
    refused = workbench.api("POST", "/api/compare", json=body)
    assert refused.status_code == 404
    error = refused.json()["error"]
    form = page.get_by_role("region", name="Conversation")
    expect(form.get_by_role("alert")).to_have_text(f"404 {error['code']}: {error['message']}")
    # the turn goes back to the box
    expect(page.get_by_role("textbox", name="Message")).to_have_value("Hello")
    expect(page.get_by_role("region", name="Comparison 1")).to_have_count(0)

    # a chat budget past the context window: the 400 the API gives that request
    page.get_by_role("switch", name="Compare").uncheck()
    page.get_by_label("Max tokens").fill("100000")
    page.get_by_role("button", name="Send").click()
    refused = workbench.api(
        "POST",
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 100000,
            "temperature": 0,
        },
    )
    assert refused.status_code == 400
    error = refused.json()["error"]
    expect(form.get_by_role("alert")).to_have_text(
        f"400 context_length_exceeded: {error['message']}"
    )
    expect_conversation(page, [])


def test_stop_ends_the_stream_and_keeps_the_text_so_far(workbench, page):
    open_chat(workbench, page, max_tokens=1900)
    say(page, "Tell me everything.")  # greedy, 912 tokens on the tiny model: seconds to stop it in
    answer = page.get_by_role("article", name="Answer 1")
    # some text besides the cursor
    expect(answer.locator(".text")).to_have_text(re.compile(r"[^\s▍]"))
    page.get_by_role("button", name="Stop").click()
    finished(answer)
    expect(answer).to_contain_text("Stopped: the stream was aborted here")
    kept = answer.locator(".text").text_content()
    assert kept
    expect_conversation(
        page,
        [
            {"role": "user", "content": "Tell me everything."},
            {"role": "assistant", "content": kept},
        ],
    )
    expect(page.get_by_role("button", name="Send")).to_be_disabled()  # nothing typed yet
    expect(page.get_by_role("button", name="Stop")).to_be_disabled()
