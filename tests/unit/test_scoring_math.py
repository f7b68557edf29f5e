"""Scoring a logits vector: normalisation over the allowed set, temperature, non-finite refusals."""

import math

import pytest
import torch

from millm.engine.scoring import NonFiniteLogits, check_reported, score
from millm.v1.token_logprobs import merged


def test_normalised_over_the_allowed_set_only():
    logits = torch.tensor([0.0, 1.0, 2.0, 5.0])
    scored = score(logits, [0, 2], temperature=1.0)
    expected = torch.log_softmax(torch.tensor([0.0, 2.0]), -1)
    assert scored.chosen == 2 and scored.chosen_logprob == pytest.approx(float(expected[1]))
    assert [t for t, _ in scored.ranked] == [2, 0]
    assert math.fsum(math.exp(lp) for _, lp in scored.ranked) == pytest.approx(1.0)


@pytest.mark.parametrize("temperature, divisor", [(0.0, 1.0), (1.0, 1.0), (0.5, 0.5), (2.0, 2.0)])
def test_temperature_divides_the_logits(temperature, divisor):
    logits = torch.tensor([0.3, 1.7, -2.0])
    scored = score(logits, None, temperature)
    expected = torch.log_softmax(logits / divisor, -1)
    assert dict(scored.ranked) == pytest.approx({i: float(expected[i]) for i in range(3)})


def test_nan_or_posinf_reaching_the_answer_is_refused():
    with pytest.raises(NonFiniteLogits) as info:
        score(torch.tensor([0.0, float("nan"), 1.0]), None, 1.0)
    assert info.value.status == 500 and info.value.code == "non_finite_logits"
    with pytest.raises(NonFiniteLogits):
        score(torch.tensor([0.0, float("inf"), 1.0]), [1, 2], 1.0)
    # Outside the allowed set, a NaN or -inf does not reach the answer.
    assert score(torch.tensor([float("nan"), 1.0, 2.0]), [1, 2], 1.0).chosen == 2


def test_neg_inf_is_fine_unless_reported():
    scored = score(torch.tensor([float("-inf"), 1.0, 2.0]), [0, 1, 2], 1.0)
    check_reported(scored, 2)  # the -inf token is third: not reported
    with pytest.raises(NonFiniteLogits, match="token 0"):
        check_reported(scored, 3)


def test_same_text_entries_share_their_total_probability():
    entries = [("yes", math.log(0.5)), ("no", math.log(0.3)), ("yes", math.log(0.2))]
    assert dict(merged(entries)) == pytest.approx({"yes": math.log(0.7), "no": math.log(0.3)})
    assert [k for k, _ in merged(entries)] == ["yes", "no"]
