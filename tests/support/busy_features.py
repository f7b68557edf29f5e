"""Features a tiny random SAE actually fires on a prompt, so sensing tests build clusters and
edges that are seen; and a cluster definition over them."""

from __future__ import annotations

from tests.api.clients import MODEL, api


def busiest(
    server, sae_id: str, prompt: str, max_tokens: int, skip: tuple[int, ...] = ()
) -> list[tuple[int, float]]:
    """(feature, peak activation) of the SAE's features, those firing at the most positions of
    a greedy completion of `prompt` first (read before steering; the attention sink left out)."""
    ask = {"sae_id": sae_id, "positions": "all", "top_k": 32, "read_point": "pre_steering"}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    read = api(server, "POST", "/v1/completions", json={**body, "return_sae_activations": ask})
    fired: dict[int, list[float]] = {}
    for position in read.json()["millm"]["sae_activations"]["positions"][1:]:
        for feature in position["features"]:
            if feature["value"] > 0 and feature["index"] not in skip:
                fired.setdefault(feature["index"], []).append(feature["value"])
    ranked = sorted(fired, key=lambda f: -len(fired[f]))
    return [(f, max(fired[f])) for f in ranked]


def sensed_cluster(name: str, layer: int, members: list[tuple[int, float]]) -> dict:
    """A cluster of these (feature, max_activation) members at `layer`, steering by almost
    nothing."""
    return {
        "kind": "mistudio.cluster-definition",
        "schema_version": "1",
        "name": name,
        "sae": {"layer": layer, "n_features": 128},
        "members": [
            {"feature_idx": f, "strength": 0.001, "max_activation": peak} for f, peak in members
        ],
    }
