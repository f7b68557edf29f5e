"""Explaining features, the parts without a model: delphi's windows and samples, its marking and
0-10 scale, the explanation's parsing, an endpoint's detection answer, and balanced accuracy."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from millm.interp.calibration_stats import pack_corpus, unpack_corpus
from millm.lab.labels.explain_examples import choose, fuzzed_marks, marks_per_window, windows
from millm.lab.labels.explain_prompts import (
    activation_line,
    detection_messages,
    explainer_messages,
    fuzz_marks,
    fuzzing_messages,
    highlighted,
    marked,
    parsed_explanation,
    scaled,
)
from millm.lab.labels.explain_scoring import ScoredText, balanced_score
from millm.lab.labels.writers import read_yes


def test_windows_cut_each_text_into_consecutive_pieces():
    ids = np.arange(10)
    acts = np.linspace(0, 0.9, 10)
    cut = windows(3, ids, acts, 4)
    assert [w.start for w in cut] == [0, 4, 8] and [len(w.tokens) for w in cut] == [4, 4, 2]
    assert cut[1].tokens == (4, 5, 6, 7) and cut[2].peak == pytest.approx(0.9)
    assert all(w.text == 3 for w in cut)


def test_choose_takes_the_top_then_samples_each_quantile_of_the_rest_and_as_many_quiet():
    rng = np.random.default_rng(0)
    peaks = np.concatenate([rng.uniform(0.1, 5.0, 40), np.zeros(30)])
    every = [w for i, p in enumerate(peaks) for w in windows(i, np.array([i]), np.array([p]), 1)]
    examples = choose(every, top=5, quantiles=4, per_quantile=2, seed=22)
    order = sorted(peaks[:40], reverse=True)
    assert [w.peak for w in examples.top] == pytest.approx(order[:5])
    rest = sorted(order[5:])  # 35 windows in 4 bins of 9, 9, 9, 8, by activation
    bins = [rest[0:9], rest[9:18], rest[18:27], rest[27:35]]
    drawn = [w.peak for w in examples.activating]
    assert len(drawn) == 8 and all(sum(1 for d in drawn if d in b) == 2 for b in bins)
    assert not {w.text for w in examples.top} & {w.text for w in examples.activating}
    assert len(examples.quiet) == 8 and all(w.peak == 0 for w in examples.quiet)
    again = choose(every, top=5, quantiles=4, per_quantile=2, seed=22)
    assert again == examples  # seeded


def test_a_feature_with_few_windows_gives_what_there_is():
    every = windows(0, np.arange(3), np.array([0.0, 2.0, 0.0]), 1)
    examples = choose(every, top=5, quantiles=10, per_quantile=2, seed=1)
    assert [w.peak for w in examples.top] == [2.0]
    assert examples.activating == [] and examples.quiet == []


def test_marking_and_the_scale_follow_delphi():
    tokens, acts = ["the", " hole", " small", "er", " but", " deep", "er"], [0, 0, 0, 9, 0, 0, 9]
    assert highlighted(tokens, acts) == "the hole small<<er>> but deep<<er>>"
    assert highlighted(["a", "b", "c"], [1.0, 1.0, 0.2]) == "<<ab>>c"
    assert scaled(2.0, 8.0) == 3 and scaled(8.0, 8.0) == 10 and scaled(0.0, 8.0) == 0
    assert activation_line(tokens, acts, 9.0) == 'Activations: ("er" : 10), ("er" : 10), '
    chat = explainer_messages([(tokens, acts)], 9.0)
    assert chat[0]["role"] == "system" and "[EXPLANATION]:" in chat[0]["content"]
    assert [m["role"] for m in chat[1:]] == ["user", "assistant"] * 3 + ["user"]
    assert (
        chat[-1]["content"]
        == f"\n{highlighted(tokens, acts)}\n{activation_line(tokens, acts, 9.0)}\n"
    )
    asked = detection_messages("comparatives", "small er")
    assert asked[-1]["content"].startswith("Latent explanation: comparatives")
    assert "Example 0: small er" in asked[-1]["content"]


def test_the_explanation_is_the_text_after_its_tag():
    assert parsed_explanation("Step 1...\n[EXPLANATION]: Comparative adjectives.\n") == (
        "Comparative adjectives."
    )
    assert parsed_explanation("[EXPLANATION]: Rivers.\nThey flow.") == "Rivers."
    assert parsed_explanation("no tag here") is None
    assert parsed_explanation("[EXPLANATION]:   ") is None


def test_an_endpoint_answer_is_read_from_its_top_logprobs_else_its_text():
    def answer(content, entries=None):
        return {"choices": [{"message": {"content": content}, "logprobs": entries}]}

    top = [{"token": "1", "logprob": math.log(0.2)}, {"token": "0", "logprob": math.log(0.6)}]
    entries = {"content": [{"token": "[", "top_logprobs": []}, {"token": "0", "top_logprobs": top}]}
    assert read_yes(answer("[0]", entries)) == pytest.approx(0.25)
    assert read_yes(answer("Sure: [1]")) == 1.0 and read_yes(answer("[0]")) == 0.0
    assert read_yes(answer("yes")) is None and read_yes(answer("[1, 0]")) is None


def test_balanced_accuracy_is_the_mean_of_both_rates_over_answered_texts():
    judged = [ScoredText(True, 0.9), ScoredText(True, 0.4), ScoredText(True, 0.5),
              ScoredText(False, 0.1), ScoredText(False, 0.7), ScoredText(False, None)]  # fmt: skip
    score = balanced_score(judged)
    assert score.true_positive_rate == pytest.approx(2 / 3)
    assert score.true_negative_rate == pytest.approx(1 / 2)
    assert score.balanced_accuracy == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert (score.texts, score.activating, score.quiet, score.failed) == (5, 3, 2, 1)
    # AUC: of the 3 x 2 (positive, negative) pairs, the positive has the larger probability in
    # (0.9 > 0.1, 0.9 > 0.7, 0.4 > 0.1, 0.5 > 0.1): 4 of 6.
    assert score.auc == pytest.approx(4 / 6)
    biased = balanced_score([ScoredText(True, 0.9), ScoredText(True, 0.8), ScoredText(False, 0.7)])
    assert biased.balanced_accuracy == 0.5 and biased.auc == 1.0
    always = balanced_score([ScoredText(True, 1.0), ScoredText(False, 1.0)])
    assert always.balanced_accuracy == 0.5


def test_fuzzing_marks_where_it_fired_or_a_seeded_count_of_random_tokens():
    assert fuzz_marks([0.0, 3.0, 0.9, 1.0]) == [False, True, True, True]  # at or above 0.3 x peak
    assert marked(["a", "b", "c", "d"], [False, True, True, False]) == "a<<bc>>d"
    fired = windows(0, np.arange(8), np.array([0, 1, 0, 2, 0, 0, 0, 0.5]), 4)
    assert marks_per_window(fired) == 2  # (2 + 1) / 2 firing tokens, rounded up
    quiet = windows(1, np.arange(6), np.zeros(6), 6)[0]
    chosen = fuzzed_marks(quiet, 2, np.random.default_rng([22, 5]))
    assert sum(chosen) == 2 and chosen == fuzzed_marks(quiet, 2, np.random.default_rng([22, 5]))
    assert sum(fuzzed_marks(quiet, 9, np.random.default_rng(0))) == 6
    assert "Example 0: a<<bc>>d" in fuzzing_messages("letters", "a<<bc>>d")[-1]["content"]


def test_a_calibrations_corpus_is_kept_exactly():
    texts = [np.array([5, 1, 99999], np.int32), np.array([], np.int32), np.array([7], np.int32)]
    back = unpack_corpus(json.loads(json.dumps(pack_corpus(texts))))
    assert [t.tolist() for t in back] == [[5, 1, 99999], [], [7]]
    with pytest.raises(ValueError):
        unpack_corpus({**pack_corpus(texts), "lengths": [1]})
