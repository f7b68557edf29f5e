"""Acceptance: the demo SAE ships calibrated on the demo model, so densities, quantiles, top
examples and percentiles are there offline on the first start, with no job run."""

import json

import httpx
import pytest

from millm.kernel.model.shipped import DEMO_SAE

pytestmark = pytest.mark.acceptance
MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
PIRATE = 1403  # the pirate profile's feature


def test_the_demo_sae_is_calibrated_on_its_corpus(demo_server):
    view = httpx.get(
        f"{demo_server.base_url}/api/saes/{SAE}/calibration", params={"features": f"0,{PIRATE}"}
    ).json()
    summary = view["summary"]
    lines = [
        line
        for line in (DEMO_SAE / "calibration_corpus.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert (
        summary["sae_id"],
        summary["model"],
        summary["corpus"],
        summary["texts"],
        summary["d_sae"],
    ) == (SAE, MODEL, "demo", len(lines), 2048)
    assert summary["features_fired"] > 1900 and summary["sample_rate"] == 1.0
    assert [f["index"] for f in view["features"]] == [0, PIRATE]
    for figures in view["features"]:
        assert (
            0 < figures["frequency"] < 0.5
            and 0 < figures["p50"] <= figures["p90"] <= figures["p99"] <= figures["max"]
        )
        assert len(figures["top_examples"]) == 5 and "[[" in figures["top_examples"][0]["display"]
    pirate_snippets = " ".join(e["display"] for e in view["features"][1]["top_examples"]).lower()
    assert any(
        word in pirate_snippets for word in ("pirate", "arr", "ship", "treasure", "matey")
    ), pirate_snippets


def test_the_shipped_file_is_small_and_names_its_model():
    document = json.loads((DEMO_SAE / "calibration.json").read_text())
    assert (document["sae_id"], document["model"]) == (SAE, MODEL)
    assert (DEMO_SAE / "calibration.json").stat().st_size < 4_000_000


def test_percentiles_come_with_return_sae_activations(demo_server):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Talk like a pirate."}],
        "max_tokens": 8,
        "temperature": 0,
        "return_sae_activations": {"positions": "completion", "top_k": 3, "percentiles": True},
    }
    block = httpx.post(
        f"{demo_server.base_url}/v1/chat/completions", json=body, timeout=120
    ).json()["millm"]["sae_activations"]
    assert block["percentiles"]["calibrated"] is True
    entries = [e for p in block["positions"] for e in p["features"]]
    assert entries and all(0 <= e["percentile"] <= 100 for e in entries)
