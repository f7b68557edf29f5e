"""contrast_prompts_blocking, the contrast a job (AutoSteer) runs from its own thread: the same
statistics as numpy on per-text max activations read offline, through one engine call on the
scheduler thread, and its refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from millm.engine.sources import resolve_source
from millm.errors import InvalidRequest
from millm.interp.formats import read_sae
from millm.lab.discovery.contrast import contrast_prompts_blocking
from millm.server.composition import build_state
from millm.settings import Settings
from tests.support.tiny_saes import build_saelens

A = ["The cat runs quickly.", "The cat is the city of France.", "The cat answers one two three."]
B = [
    "Paris reads a small autoencoder.",
    "Sparse codes count quickly.",
    "My friend writes über.",
    "Every feature is naïve café.",
]


@pytest.fixture(scope="module")
def state(tiny_dirs, tmp_path_factory):
    home = tmp_path_factory.mktemp("contrast-blocking")
    settings = Settings.model_validate(
        {"MILLM_HOME": home / "home", "MILLM_DTYPE": "float32", "MILLM_DEVICE": "cpu"}
    )
    server = build_state(settings, resolve_source(str(tiny_dirs["llama"]), home / "hub"))
    server.switch.load_in_background().join(120)
    sae_dir = build_saelens(home / "sae", layer=1, architecture="jumprelu", seed=21)
    info, _ = server.saes.register(str(sae_dir), None, None, None)
    server.switch.attach_sae(info.id, None)
    yield server
    server.close()


def offline_max(state, texts: list[str]) -> np.ndarray:
    """Each text's per-feature max over positions 1.. of an encode of layer 1's output, read from a
    stock transformers copy of the model (the served one runs the lean runner's fused blocks)."""
    lm = state.switch.lm
    sae = read_sae(Path(state.saes.infos[next(iter(state.steering.attached))].path))[1]
    model = AutoModelForCausalLM.from_pretrained(
        str(lm.source.directory), dtype=torch.float32
    ).eval()
    captured = {}
    model.model.layers[1].register_forward_hook(
        lambda m, a, out: captured.update(h=(out[0] if isinstance(out, tuple) else out)[0])
    )
    rows = []
    for text in texts:
        with torch.no_grad():
            model(torch.tensor([lm.tokenizer(text)["input_ids"]]))
            rows.append(sae.encode(captured["h"])[1:].max(0).values.double().numpy())
    return np.stack(rows)


def test_the_same_statistics_as_numpy_on_an_offline_read(state):
    lm = state.switch.lm
    attached = next(iter(state.steering.attached.values()))
    ids_a, ids_b = ([lm.tokenizer(t)["input_ids"] for t in texts] for texts in (A, B))
    result = contrast_prompts_blocking(state, lm.name, attached, ids_a, ids_b, top_k=4)
    a, b = offline_max(state, A), offline_max(state, B)
    pooled = np.sqrt(
        ((len(a) - 1) * a.var(0, ddof=1) + (len(b) - 1) * b.var(0, ddof=1)) / (len(a) + len(b) - 2)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(pooled > 0, (a.mean(0) - b.mean(0)) / pooled, 0.0)
    assert (result.sae_id, result.aggregate, result.texts_a, result.texts_b) == (
        attached.info.id,
        "max",
        3,
        4,
    )
    assert [f.index for f in result.favouring_a] == list(np.argsort(-d, kind="stable")[:4])
    assert [f.index for f in result.favouring_b] == list(np.argsort(d, kind="stable")[:4])
    for feature in result.favouring_a + result.favouring_b:
        assert feature.effect_size == pytest.approx(d[feature.index], rel=1e-4)
        assert feature.mean_a == pytest.approx(a[:, feature.index].mean(), rel=1e-4, abs=1e-5)
        assert feature.label is not None


def test_a_prompt_without_a_read_position_is_refused(state):
    attached = next(iter(state.steering.attached.values()))
    with pytest.raises(InvalidRequest, match=r"b\[1\] is 1 token long"):
        contrast_prompts_blocking(
            state, state.switch.lm.name, attached, [[1, 5, 6]], [[1, 7, 8], [1]]
        )
    with pytest.raises(InvalidRequest, match="a text in each set"):
        contrast_prompts_blocking(state, state.switch.lm.name, attached, [[1, 5, 6]], [])
