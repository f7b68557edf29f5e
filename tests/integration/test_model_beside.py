"""A registered model loaded beside the served one for a job (kernel/model/beside.py), on the
tiny models: planned with nothing to reclaim (a name not registered is a 400 naming the field, a
model past MILLM_MEMORY_LIMIT_BYTES the load's 503), loaded with a scheduler of its own that
answers as the stock model does, held by one job at a time (model_busy for a second), and its
scheduler stopped when the job lets it go."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from millm.engine.jobs import RowSpec
from millm.engine.sampling import SamplingParams
from millm.errors import InsufficientMemoryToLoad, InvalidRequest, ModelBusy
from millm.kernel.model.beside import ModelsBeside
from millm.kernel.model.registry import ModelRegistry
from millm.kernel.runtime.blocking import generate_blocking
from millm.settings import Settings
from millm.store.database import Store, database_url


@pytest.fixture
def registry(tiny_dirs, tmp_path) -> ModelRegistry:
    registry = ModelRegistry(Store(database_url(tmp_path, None)), tmp_path / "hub")
    registry.register(str(tiny_dirs["gemma2"]), "gemma")
    return registry


def settings(tmp_path, **extra) -> Settings:
    fields = {"MILLM_HOME": tmp_path, "MILLM_DEVICE": "cpu", "MILLM_DTYPE": "float32", **extra}
    return Settings(**fields)


def test_a_model_beside_answers_as_the_stock_model_and_is_held_by_one_job(
    registry, tiny_dirs, tmp_path
):
    beside = ModelsBeside(settings(tmp_path), registry)
    with pytest.raises(InvalidRequest) as refused:
        beside.plan("nope", "scorer_model")
    assert refused.value.param == "scorer_model" and refused.value.code == "model_not_found"

    planned = beside.plan("gemma", "explainer_model")
    prompt = [1, 5, 9, 13, 17]
    row = RowSpec(prompt_ids=tuple(prompt), sampling=SamplingParams(temperature=0.0), max_tokens=6)
    with beside.loaded(planned) as engine:
        assert engine.name == "gemma"
        [answer] = generate_blocking(None, engine, [row])
        with pytest.raises(ModelBusy), beside.loaded(planned):
            pass
        scheduler, tokenizer = engine.scheduler, engine.lm.tokenizer
    assert not scheduler.thread_alive
    with pytest.raises(ModelBusy, match="freed"):  # let go: it holds nothing any more
        engine.submit(None)
    stock = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["gemma2"]), dtype=torch.float32)
    with torch.no_grad():
        out = stock.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)
    assert answer.completion_tokens == 6
    assert answer.text == tokenizer.decode(out[0, len(prompt) :])
    with beside.loaded(planned) as again:  # let go: the next job may hold one
        assert again.name == "gemma"


def test_a_model_that_does_not_fit_is_refused_before_any_load(registry, tmp_path):
    beside = ModelsBeside(settings(tmp_path, MILLM_MEMORY_LIMIT_BYTES=1024), registry)
    with pytest.raises(InsufficientMemoryToLoad, match="MILLM_MEMORY_LIMIT_BYTES"):
        beside.plan("gemma", "explainer_model")
