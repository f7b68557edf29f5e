"""Sampling rules: penalty mapping, nucleus mask, temperature, seeded draws."""

import math

import pytest
import torch

from millm.engine.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    drawn_logprobs,
    next_token,
    penalty_factors,
    top_p_mask,
)


@pytest.mark.parametrize(
    "presence, frequency, count, factor",
    [
        (0.0, 0.0, 3, 1.0),
        (1.0, 0.0, 1, 1.1),
        (1.0, 0.0, 5, 1.1),  # presence ignores how often
        (0.0, 0.5, 4, 1.1**2),  # frequency compounds per repeat
        (1.0, 1.0, 2, 1.1**3),
        (-2.0, 0.0, 1, 1.1**-2),  # negative: repetition encouraged
        (2.0, 2.0, 0, 1.0),  # unseen tokens are never penalised
    ],
)
def test_penalty_factor_mapping(presence, frequency, count, factor):
    got = penalty_factors(torch.tensor([count]), presence, frequency)
    assert got.item() == pytest.approx(factor, rel=1e-6)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    logits = torch.tensor([2.0, -2.0, 5.0, 1.0])
    out = apply_repetition_penalty(
        logits, torch.tensor([0, 1]), torch.tensor([1, 1]), presence=1.0, frequency=0.0
    )
    assert out.tolist() == pytest.approx([2.0 / 1.1, -2.0 * 1.1, 5.0, 1.0])
    assert logits.tolist() == [2.0, -2.0, 5.0, 1.0]  # input untouched


@pytest.mark.parametrize(
    "top_p, kept",
    [
        (0.0, [True, False, False]),
        (0.5, [True, False, False]),
        (0.6, [True, True, False]),
        (0.81, [True, True, True]),
    ],
)
def test_top_p_mask_keeps_smallest_set_reaching_mass(top_p, kept):
    probs = torch.tensor([0.3, 0.5, 0.2])  # sorted: 0.5 (id 1), 0.3 (id 0), 0.2 (id 2)
    mask = top_p_mask(probs, top_p)
    order = [1, 0, 2]
    assert [bool(mask[i]) for i in order] == kept


def test_greedy_takes_argmax_and_penalty_can_change_it():
    logits = torch.tensor([1.0, 3.0, 2.9])
    assert next_token(logits, SamplingParams(temperature=0.0), None) == 1
    penalised = SamplingParams(temperature=0.0, presence_penalty=1.0)
    assert next_token(logits, penalised, None, torch.tensor([1]), torch.tensor([1])) == 2


def _frequencies(logits, params, draws=4000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(logits))
    for _ in range(draws):
        counts[next_token(logits, params, generator)] += 1
    return (counts / draws).tolist()


@pytest.mark.parametrize(
    "temperature, expected",
    [(1.0, [0.25, 0.75]), (2.0, [1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3))])],
)
def test_temperature_divides_logits(temperature, expected):
    logits = torch.tensor([0.0, math.log(3.0)])
    freq = _frequencies(logits, SamplingParams(temperature=temperature))
    assert freq == pytest.approx(expected, abs=0.03)


def test_top_p_never_samples_outside_nucleus():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    freq = _frequencies(logits, SamplingParams(temperature=1.0, top_p=0.7), draws=2000)
    assert freq[2] == 0.0
    assert freq[0] == pytest.approx(0.6 / 0.9, abs=0.04)


def test_same_seed_same_draws_different_seed_differs():
    logits = torch.zeros(50)
    params = SamplingParams(temperature=1.0)
    draw = lambda seed: [
        next_token(logits, params, g)
        for g in [torch.Generator().manual_seed(seed)]
        for _ in range(20)
    ]
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


@pytest.mark.parametrize("temperature", [7.2e-155, 1e-300, 5e-324])
def test_a_tiny_temperature_samples_the_top_token_instead_of_failing(temperature):
    # logits / 7e-155 overflows to inf, and softmax of several infs is NaN (multinomial then
    # raised).
    logits = torch.tensor([1.5, 3.0, -2.0, 2.9])
    generator = torch.Generator().manual_seed(0)
    draws = {
        next_token(logits, SamplingParams(temperature=temperature), generator) for _ in range(20)
    }
    assert draws == {1}
    tied = torch.tensor([3.0, 3.0, -1.0])
    assert {
        next_token(tied, SamplingParams(temperature=temperature), generator) for _ in range(40)
    } == {0, 1}


# greedy reads the logits unscaled
@pytest.mark.parametrize(("temperature", "scale"), [(0.0, 1.0), (1.0, 1.0), (0.5, 0.5)])
def test_drawn_logprobs_are_of_the_tempered_distribution(temperature, scale):
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    logprob, top = drawn_logprobs(logits, SamplingParams(temperature=temperature), 1, 2)
    expected = torch.log_softmax(logits / scale, -1)
    assert logprob == pytest.approx(expected[1].item(), abs=1e-6)
    assert [t for t, _ in top] == [0, 1]
    assert [lp for _, lp in top] == pytest.approx(expected[:2].tolist(), abs=1e-6)


def test_drawn_logprobs_leave_out_what_a_grammar_made_impossible():
    masked = torch.tensor([1.0, float("-inf"), 0.0, float("-inf")])
    logprob, top = drawn_logprobs(masked, SamplingParams(temperature=0.0), 0, 4)
    assert [t for t, _ in top] == [0, 2]  # the -inf ids are no alternatives
    assert logprob == pytest.approx(math.log(math.e / (math.e + 1)), abs=1e-6)
    assert drawn_logprobs(masked, SamplingParams(), 2, 0)[1] == []  # no alternatives asked
