"""The decode loop against transformers' own generate, and its batching, seeds, stops and limits."""

import functools

import pytest
import torch

from millm.engine.generate import run_job
from millm.engine.jobs import GenerationJob, RowFinished, TextDelta
from millm.engine.sampling import SamplingParams
from tests.integration.engine_helpers import generate, prompt_ids, row

SAMPLED = SamplingParams(temperature=1.0, top_p=0.9)


@functools.cache
def stock_model(directory):
    """The checkpoint as plain transformers loads it: no millm runner, no kernels."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()


def reference_greedy(lm, prompt, max_new_tokens):
    """transformers' own generate, greedy, on a stock copy of the same checkpoint: tokens after
    the prompt."""
    with torch.inference_mode():
        out = stock_model(str(lm.source.directory)).generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=sorted(lm.eos_token_ids),
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("model", ["llama_lm", "gemma2_lm"])
def test_greedy_matches_transformers_generate(model, request):
    lm = request.getfixturevalue(model)
    prompt = prompt_ids(lm, "The cat runs quickly to Paris")
    expected = reference_greedy(lm, prompt, 60)  # 60 > gemma2's sliding window of 16
    got = generate(lm, [row(prompt, max_tokens=60)])
    assert got.texts.get(0, "") == lm.tokenizer.decode(expected, skip_special_tokens=True)
    assert got.tokens[0] == len(expected)
    assert got.finish[0] == ("stop" if expected[-1] in lm.eos_token_ids else "length")


@pytest.mark.parametrize("model", ["llama_lm", "gemma2_lm"])
def test_left_padded_rows_equal_their_solo_runs(model, request):
    lm = request.getfixturevalue(model)
    short, long = (
        prompt_ids(lm, "Hello"),
        prompt_ids(lm, "My friend answers the city of France quickly"),
    )
    together = generate(lm, [row(short, 40), row(long, 40)])
    assert together.texts[0] == generate(lm, [row(short, 40)]).texts[0]
    assert together.texts[1] == generate(lm, [row(long, 40)]).texts[0]


def test_rows_sharing_a_prompt_are_seeded_separately(llama_lm):
    prompt = prompt_ids(llama_lm, "The model")
    both = generate(llama_lm, [row(prompt, 30, SAMPLED, seed=7), row(prompt, 30, SAMPLED, seed=8)])
    assert both.texts[0] == generate(llama_lm, [row(prompt, 30, SAMPLED, seed=7)]).texts[0]
    assert both.texts[1] == generate(llama_lm, [row(prompt, 30, SAMPLED, seed=8)]).texts[0]
    assert both.texts[0] != both.texts[1]


def test_unseeded_sampling_differs_between_runs(llama_lm):
    prompt = prompt_ids(llama_lm, "The model")
    # a row whose first draw is the end-of-sequence token has no text: three runs, not two
    texts = [generate(llama_lm, [row(prompt, 30, SAMPLED)]).texts.get(0, "") for _ in range(3)]
    assert len(set(texts)) > 1


def test_stop_string_cuts_text_and_stops(llama_lm):
    prompt = prompt_ids(llama_lm, "Every feature reads")
    free = generate(llama_lm, [row(prompt, 40)])
    text = free.texts[0]
    stop = text[10:13]
    cut = text.index(stop)
    stopped = generate(llama_lm, [row(prompt, 40, stop=[stop])])
    assert stopped.texts.get(0, "") == text[:cut]
    assert stopped.finish[0] == "stop"
    assert stopped.tokens[0] < free.tokens[0]


def test_max_tokens_ends_with_length(llama_lm):
    out = generate(llama_lm, [row(prompt_ids(llama_lm, "The cat"), max_tokens=7)])
    assert out.finish[0] == "length" and out.tokens[0] == 7


def test_generation_config_eos_ends_with_stop(tiny_dirs, tmp_path, llama_lm):
    from tests.conftest import load_tiny
    from tests.support.tiny_models import with_extra_eos

    prompt = prompt_ids(llama_lm, "Paris is")
    free = reference_greedy(llama_lm, prompt, 12)
    eos = free[4]
    variant = load_tiny(
        with_extra_eos(tmp_path / "eos", tiny_dirs["llama"], [eos]), tmp_path / "home"
    )
    out = generate(variant, [row(prompt, 12)])
    stop_at = free.index(eos)
    assert out.finish[0] == "stop"
    assert out.tokens[0] == stop_at + 1  # the EOS token counts as generated
    assert out.texts.get(0, "") == llama_lm.tokenizer.decode(
        free[:stop_at], skip_special_tokens=True
    )


def test_cancel_stops_generation(llama_lm):
    events = []

    def emit(event):
        events.append(event)
        if sum(isinstance(e, TextDelta) for e in events) == 3:
            job.cancel()

    job = GenerationJob(rows=[row(prompt_ids(llama_lm, "The cat"), max_tokens=100)], emit=emit)
    run_job(llama_lm, job)
    assert sum(isinstance(e, TextDelta) for e in events) <= 4
    assert not any(isinstance(e, RowFinished) for e in events)


def test_finished_rows_leave_the_batch(llama_lm):
    prompt = prompt_ids(llama_lm, "A river")
    out = generate(llama_lm, [row(prompt, 3), row(prompt, 25), row(prompt, 10)])
    assert [out.tokens[i] for i in range(3)] == [3, 25, 10]
    solo = generate(llama_lm, [row(prompt, 25)]).texts[0]
    assert out.texts[1] == solo and solo.startswith(out.texts[2]) and solo.startswith(out.texts[0])
