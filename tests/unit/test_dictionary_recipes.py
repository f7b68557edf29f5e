"""A training request's memory bounds on a model of real size (Gemma 2 2B's configuration, no
weights): a transcoder set counts the float32 copy of every block's MLP it re-runs for its
targets beside its own state, and says which of the two to change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import Gemma2Config

from millm.errors import InvalidRequest
from millm.lab.dictionaries.protocol import TrainRequest
from millm.lab.dictionaries.recipes import recipe_of
from millm.settings import Settings

GEMMA2_2B = Gemma2Config(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26)
MLPS = 4 * 26 * 3 * 2304 * 9216  # 6.2 GiB: every block's gated MLP in float32


def request(**fields) -> TrainRequest:
    body = {
        "kind": "transcoder_set",
        "k": 16,
        "batch_tokens": 1024,
        "corpus": {"texts": ["a text"]},
    }
    body.update(fields)
    return TrainRequest.model_validate(body)


def refusal(body: TrainRequest, cap: int) -> str:
    lm = SimpleNamespace(name="gemma-2-2b", config=GEMMA2_2B)
    with pytest.raises(InvalidRequest) as refused:
        recipe_of(body, lm, Settings(MILLM_DICTIONARY_MAX_BYTES=cap))
    assert refused.value.param == "d_sae"
    return refused.value.message


def test_a_sets_bound_counts_its_blocks_mlps_in_float32():
    lm = SimpleNamespace(name="gemma-2-2b", config=GEMMA2_2B)
    state = 16 * 26 * (2 * 512 * 2304 + 512 + 2304)  # 0.9 GiB
    assert 7 << 30 < state + MLPS < 8 << 30
    recipe = recipe_of(request(d_sae=512), lm, Settings(MILLM_DICTIONARY_MAX_BYTES=8 << 30))
    assert (recipe.transcoders, recipe.d_sae) == (26, 512)

    wider = refusal(request(d_sae=4096), 8 << 30)  # 7.3 GiB of state, and the MLPs
    assert "with the blocks' MLPs in float32 (6.2 GiB)" in wider and wider.endswith(
        "use fewer latents"
    )
    under_the_mlps = refusal(request(d_sae=512), 6 << 30)  # the MLPs alone take 6.2 GiB
    assert "take 7.1 GiB to train" in under_the_mlps
    assert under_the_mlps.endswith("raise it to train on this model")
    over_them = refusal(request(d_sae=512), 7 << 30)  # fewer latents would fit
    assert over_them.endswith("use fewer latents")


def test_an_saes_bound_is_its_own_state():
    lm = SimpleNamespace(name="gemma-2-2b", config=GEMMA2_2B)
    sae = TrainRequest.model_validate({"layer": 12, "d_sae": 16384, "corpus": {"texts": ["a"]}})
    state = 16 * (2 * 16384 * 2304 + 16384 + 2304)  # 1.1 GiB: no MLP is re-run
    assert recipe_of(sae, lm, Settings(MILLM_DICTIONARY_MAX_BYTES=state)).d_sae == 16384
    assert "an SAE of 16384 latents" in refusal(sae, state - 1)
