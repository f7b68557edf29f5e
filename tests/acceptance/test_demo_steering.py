"""Acceptance: `millm serve` with no arguments attaches the demo SAE and ships the demo profiles,
which steer."""

import httpx
import pytest

from tests.api.clients import sdk

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
WEEKEND = [{"role": "user", "content": "Tell me about your weekend."}]


def answer(server, **extra):
    response = sdk(server).chat.completions.create(
        model=MODEL, messages=WEEKEND, max_tokens=60, temperature=0, extra_body=extra or None
    )
    return response.choices[0].message.content


def test_demo_sae_is_attached_with_labels(demo_server):
    saes = httpx.get(f"{demo_server.base_url}/api/saes").json()["data"]
    assert [(s["id"], s["attached"], s["attached_layer"], s["d_sae"]) for s in saes] == [
        ("sae_262743630f92", True, 12, 2048)
    ]
    found = httpx.get(
        f"{demo_server.base_url}/api/saes/sae_262743630f92/features", params={"q": "pirate"}
    ).json()["data"]
    assert 1403 in [f["index"] for f in found]


# What each profile is about (its description's words and their kin). The greedy text differs
# between CPU kinds (bf16 kernels), so the test asks that the steered answer talks about the topic
# more than the plain one does, not for any one word.
TOPICS = {
    "pirate": ["pirate", "ship", "sea", "sail", "captain", "treasure", "crew"],
    "italian-food": [
        "Italian",
        "Italy",
        "pasta",
        "pizza",
        "Margherita",
        "mozzarella",
        "prosciutto",
        "cheese",
        "recipe",
        "tomato",
        "dish",
        "cook",
    ],
    "music": ["melody", "melodies", "song", "music", "sing", "tune", "rhythm"],
    "france": [
        "French",
        "France",
        "Paris",
        "Bordeaux",
        "café",
        "cafe",
        "Eiffel",
        "Louvre",
        "Versailles",
        "Champs",
        "Seine",
        "Provence",
        "croissant",
        "baguette",
        "bonjour",
    ],
}


def topic_words(text: str, profile: str) -> int:
    """How many times the text names the profile's topic."""
    return sum(text.lower().count(word.lower()) for word in TOPICS[profile])


@pytest.mark.parametrize("profile", TOPICS)
def test_demo_profiles_change_the_answer_plainly(demo_server, profile):
    plain = answer(demo_server)
    steered = answer(demo_server, profile=profile)
    assert steered != plain
    assert topic_words(steered, profile) >= topic_words(plain, profile) + 2, (steered, plain)


def test_unsteered_by_default(demo_server):
    state = httpx.get(f"{demo_server.base_url}/api/steering").json()
    assert (
        state["enabled"]
        and state["active_base"] is None
        and all(not s["features"] for s in state["saes"])
    )
