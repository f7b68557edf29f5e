"""Acceptance: `millm serve` with no arguments attaches the demo SAE and ships the demo profiles, which steer."""

import httpx
import pytest

from tests.api.clients import sdk

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
WEEKEND = [{"role": "user", "content": "Tell me about your weekend."}]


def answer(server, **extra):
    response = sdk(server).chat.completions.create(model=MODEL, messages=WEEKEND, max_tokens=60, temperature=0, extra_body=extra or None)
    return response.choices[0].message.content


def test_demo_sae_is_attached_with_labels(demo_server):
    saes = httpx.get(f"{demo_server.base_url}/api/saes").json()["data"]
    assert [(s["id"], s["attached"], s["attached_layer"], s["d_sae"]) for s in saes] == [("sae_dd8838d57250", True, 12, 2048)]
    found = httpx.get(f"{demo_server.base_url}/api/saes/sae_dd8838d57250/features", params={"q": "pirate"}).json()["data"]
    assert 1403 in [f["index"] for f in found]


@pytest.mark.parametrize(
    "profile, words",
    # italian-food: on an AMD Zen 4 the answer names Margherita, prosciutto and mozzarella; on an
    # Intel Xeon with AMX (other bf16 kernels) the greedy text turns to a recipe with cheese instead.
    [("pirate", ["pirate", "ship", "sea"]), ("italian-food", ["Margherita", "mozzarella", "prosciutto", "recipe", "cheese"]), ("music", ["melody", "song", "music"]), ("france", ["French", "France", "Paris"])],
)
def test_demo_profiles_change_the_answer_plainly(demo_server, profile, words):
    plain = answer(demo_server)
    steered = answer(demo_server, profile=profile)
    assert steered != plain
    assert any(word in steered for word in words), steered
    assert not any(word in plain for word in words if word not in ("music", "sea"))


def test_unsteered_by_default(demo_server):
    state = httpx.get(f"{demo_server.base_url}/api/steering").json()
    assert state["enabled"] and state["active_base"] is None and all(not s["features"] for s in state["saes"])
