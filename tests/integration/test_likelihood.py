"""The unsteered log-likelihood of a continuation equals a stock transformers forward pass, token
by token."""

from __future__ import annotations

import threading

import pytest
import torch

from millm.engine.jobs import LikelihoodJob, LikelihoodsReady
from millm.engine.likelihood import continuation_logprobs, run_likelihood
from millm.engine.residual import Stacked


def reference(tiny_dirs, sequence: list[int], start: int) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(tiny_dirs["llama"]), dtype=torch.float32
    ).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([sequence])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[t - 1, sequence[t]]) for t in range(start, len(sequence))]


def test_continuation_logprobs_match_a_plain_forward_pass(llama_lm, tiny_dirs):
    sequence = [5, 17, 33, 2, 48, 19, 7, 61, 23]
    got = continuation_logprobs(llama_lm, sequence, 4)
    want = reference(tiny_dirs, sequence, 4)
    assert len(got) == 5
    assert got == pytest.approx(want, abs=1e-4)
    assert continuation_logprobs(llama_lm, sequence, len(sequence)) == []
    with pytest.raises(ValueError):
        continuation_logprobs(llama_lm, sequence, 0)


def test_a_likelihood_job_answers_every_sequence_and_ignores_steering_left_installed(
    llama_lm, tiny_dirs
):
    sequences = [[5, 17, 33, 2, 48], [9, 9, 40, 12]]
    events = []
    vector = torch.ones(llama_lm.model.config.hidden_size) * 50.0
    # a previous job's steering must not leak in
    llama_lm.residual.install(Stacked({0: vector[None, None, :]}))
    run_likelihood(
        llama_lm,
        LikelihoodJob(
            sequences=sequences, starts=[2, 1], emit=events.append, cancelled=threading.Event()
        ),
    )
    assert len(events) == 1 and isinstance(events[0], LikelihoodsReady)
    assert events[0].token_logprobs[0] == pytest.approx(
        reference(tiny_dirs, sequences[0], 2), abs=1e-4
    )
    assert events[0].token_logprobs[1] == pytest.approx(
        reference(tiny_dirs, sequences[1], 1), abs=1e-4
    )
