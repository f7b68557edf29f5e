"""Acceptance: Ember's routes on the demo server, spoken to directly: what the goodfire SDK's
Variant never sends (a pin), and what millm's steering has no word for (refused, naming the
controller's part)."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
PIRATE, FOOD = 1403, 797
EMBER = "/api/inference/v1"


def feature(index: int, sae_digits: str = "262743630f92") -> dict:
    """A feature as the SDK's Feature.json() sends it (its id without dashes)."""
    return {
        "uuid": f"{sae_digits}8000{(1 << 63) | index:016x}",
        "label": "",
        "index_in_sae": index,
        "max_activation_strength": 1,
    }


def edit(index: int, value: float, mode: str = "nudge") -> dict:
    return {"mode": mode, "features": {"features": [feature(index)]}, "value": value}


def scope(conditionals: list[dict], interventions=(), event: str | None = None, **extra) -> dict:
    return {
        "conditionals": {"conditionals": conditionals, "operator": extra.pop("join", "AND")},
        "controller": {"interventions": list(interventions), "scopes": extra.pop("inner", [])},
        "is_active": False,
        "event_name": event,
    }


def above(index: int, level, operator: str = ">") -> dict:
    return {"left_hand": {"features": [feature(index)]}, "right_hand": level, "operator": operator}


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{EMBER}{path}", json=body, timeout=300)


def chat(server, controller: dict, content: str = "Tell me about your weekend.", **extra):
    return post(
        server,
        "/chat/completions",
        {
            "messages": [{"role": "user", "content": content}],
            "model": MODEL,
            "max_completion_tokens": 8,
            "temperature": 0,
            "controller": {"interventions": [], "scopes": [], **controller},
            **extra,
        },
    )


def test_a_pin_holds_the_feature_at_its_fraction_of_the_peak(demo_server):
    peak = httpx.get(f"{demo_server.base_url}/api/saes/{SAE}/features/{FOOD}?k=1").json()[
        "calibration"
    ]["max"]
    read = post(
        demo_server,
        "/chat-attribution/compute-features",
        {
            "messages": [
                {"role": "user", "content": "Tell me about your weekend."},
                {"role": "assistant", "content": "I read a book and walked by the river."},
            ],
            "model": MODEL,
            "controller": {"interventions": [edit(FOOD, 0.5, "pin")], "scopes": []},
            "include_feature_indexes": [FOOD],
        },
    )
    assert read.status_code == 200, read.text
    values = [
        a["activation_strength"]
        for token in read.json()["tokens"][1:]  # position 0 is the attention sink
        for a in token["attributions"]
    ]
    # held at 0.5 x the peak at every read position (to 1%: the residual write is rounded to the
    # model's dtype before the read)
    assert len(values) == len(read.json()["tokens"]) - 1
    assert values == pytest.approx([0.5] * len(values), rel=0.01)
    assert peak > 10  # the unit is the calibrated peak, not 1


@pytest.mark.parametrize(
    "controller, param, words",
    [
        ({"interventions": [edit(PIRATE, 0.5, "mul")]}, "controller.interventions[0].mode", "mul"),
        (
            {"interventions": [edit(PIRATE, 0.5, "pin"), edit(PIRATE, 0.2)]},
            "controller.interventions[1]",
            "pinned and nudged",
        ),
        ({"interventions": [edit(PIRATE, 5.0)]}, "controller.interventions[0].value", "±200"),
        ({"interventions": [edit(PIRATE, -0.1, "pin")]}, "controller.interventions[0].value", "0"),
        (
            {"scopes": [scope([above(PIRATE, 0.5, "<")], event="e")]},
            "controller.scopes[0].conditionals.conditionals[0].operator",
            "'<'",
        ),
        (
            {"scopes": [scope([above(PIRATE, 0.5), above(FOOD, 0.5)], event="e", join="OR")]},
            "controller.scopes[0].conditionals",
            "joined by OR",
        ),
        (
            {"scopes": [scope([above(PIRATE, feature(FOOD))], event="e")]},
            "controller.scopes[0].conditionals.conditionals[0].right_hand",
            "a feature compared with a feature",
        ),
        (
            {"scopes": [scope([above(PIRATE, 0)], event="e")]},
            "controller.scopes[0].conditionals.conditionals[0].right_hand",
            "above 0",
        ),
        (
            {"scopes": [scope([above(PIRATE, 0.5)], inner=[scope([above(FOOD, 0.5)])])]},
            "controller.scopes[0].controller.scopes",
            "inside a condition",
        ),
        ({"min_nudge_entropy": 0.2}, "controller.min_nudge_entropy", "min_nudge_entropy"),
    ],
)
def test_what_millms_steering_has_no_word_for_is_refused(demo_server, controller, param, words):
    answer = chat(demo_server, controller)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_feature_of_an_sae_not_here_is_not_found(demo_server):
    stranger = {"mode": "nudge", "features": {"features": [feature(7, "0" * 12)]}, "value": 0.5}
    answer = chat(demo_server, {"interventions": [stranger]})
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "sae_not_found"
    malformed = post(
        demo_server,
        "/features/rerank",
        {"query": "pirate", "model": MODEL, "feature_ids": ["not-a-uuid"], "top_k": 3},
    )
    assert malformed.status_code == 400
    error = malformed.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_feature_id", "feature_ids[0]")


def test_an_abort_names_the_sdks_event_in_the_answer_and_the_stream(demo_server):
    controller = {"scopes": [scope([above(PIRATE, 0.5)], event="stop-here")]}
    whole = chat(demo_server, controller, "Tell me about pirates.")
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["gf_event_names"] == ["stop-here"]
    assert body["choices"][0]["finish_reason"] == "content_filter"
    streamed = chat(demo_server, controller, "Tell me about pirates.", stream=True)
    frames = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert "[DONE]" not in frames  # the SDK would read it as a chunk when it arrives with one
    last = httpx.Response(200, content=frames[-1]).json()
    assert last["gf_event_names"] == ["stop-here"]
    assert last["choices"][0]["finish_reason"] == "content_filter"
