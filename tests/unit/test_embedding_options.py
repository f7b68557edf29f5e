"""Embeddings' pooling and normalisation as numbers, and the refusals made from the request alone
(empty inputs, inputs over the context window, too many inputs, an unknown pooling)."""

import numpy as np
import pytest
import torch

from millm.engine.embed import pool
from millm.errors import EmbeddingInvalid, InputsTooLong, InvalidRequest
from millm.v1.serving.embeddings import checked
from millm.v1.serving.prechecks import check_inputs
from millm.v1.serving.protocol import EmbeddingRequest

# Two rows of three positions: the first left-padded (position 0 is padding), the second full.
HIDDEN = torch.tensor(
    [
        [[9.0, 9.0], [1.0, 2.0], [3.0, 6.0]],
        [[2.0, 0.0], [4.0, 0.0], [6.0, 3.0]],
    ]
)
LEFT = torch.tensor([[0, 1, 1], [1, 1, 1]])
# The same rows right-padded, as the llama.cpp runner returns them.
HIDDEN_RIGHT = torch.tensor(
    [
        [[1.0, 2.0], [3.0, 6.0], [0.0, 0.0]],
        [[2.0, 0.0], [4.0, 0.0], [6.0, 3.0]],
    ]
)
RIGHT = torch.tensor([[1, 1, 0], [1, 1, 1]])


@pytest.mark.parametrize(
    "pooling, expected",
    [
        ("mean", [[2.0, 4.0], [4.0, 1.0]]),
        ("last", [[3.0, 6.0], [6.0, 3.0]]),
        ("cls", [[1.0, 2.0], [2.0, 0.0]]),
    ],
)
def test_each_pooling_reads_the_real_positions_whatever_the_padding(pooling, expected):
    assert pool(HIDDEN, LEFT, pooling).tolist() == expected
    assert pool(HIDDEN_RIGHT, RIGHT, pooling).tolist() == expected
    assert pool(HIDDEN, LEFT, pooling).dtype == torch.float32


def test_normalised_vectors_have_length_one_and_the_rest_are_kept():
    vectors = np.array([[3.0, 4.0], [0.5, -0.5]], dtype=np.float32)
    scaled = checked(vectors, normalize=True)
    assert np.linalg.norm(scaled, axis=1) == pytest.approx([1.0, 1.0], abs=1e-6)
    assert scaled[0].tolist() == pytest.approx([0.6, 0.8])
    assert checked(vectors, normalize=False).tolist() == vectors.tolist()


@pytest.mark.parametrize(
    "vectors, normalize, needle",
    [
        ([[1.0, 2.0], [0.0, 0.0]], True, "length 0"),
        ([[1.0, 2.0], [np.nan, 1.0]], False, "not finite"),
        ([[1.0, 2.0], [np.inf, 1.0]], True, "not finite"),
    ],
)
def test_a_vector_that_cannot_be_answered_names_its_input(vectors, normalize, needle):
    with pytest.raises(EmbeddingInvalid) as info:
        checked(np.array(vectors, dtype=np.float32), normalize)
    assert info.value.param == "input[1]" and needle in info.value.message
    assert (info.value.status, info.value.code) == (500, "embedding_vector_invalid")


def body(**fields) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"model": "m", **fields})


@pytest.mark.parametrize(
    "value, param, message",
    [
        ("", "input", "input must not be empty"),
        ([], "input", "input must contain at least one string"),
        (["a", "", "b", ""], "input[1]", "input[1] must not be empty (2 empty inputs)"),
        ([[1, 2], []], "input[1]", "input[1] must not be empty"),
    ],
)
def test_an_empty_input_is_refused_naming_the_first(value, param, message):
    with pytest.raises(InvalidRequest) as info:
        body(input=value)
    assert (info.value.param, info.value.message) == (param, message)


def test_pooling_is_one_of_three_and_normalize_a_bool():
    assert (body(input="a", pooling="cls").pooling, body(input="a").pooling) == ("cls", None)
    for fields in ({"pooling": "max"}, {"normalize": "yes"}):
        with pytest.raises(Exception) as info:
            body(input="a", **fields)
        assert list(fields)[0] in str(info.value)


def test_more_inputs_than_the_setting_are_refused_before_any_model():
    check_inputs(body(input=["a"] * 4), 4)
    check_inputs(body(input=[1, 2, 3, 4, 5]), 4)  # one token-id list is one input
    with pytest.raises(InvalidRequest) as info:
        check_inputs(body(input=["a"] * 5), 4)
    assert info.value.param == "input"
    assert "input has 5 items; the limit is 4 (MILLM_EMBEDDINGS_MAX_INPUTS)" in info.value.message


def test_every_input_over_the_window_is_named_and_the_first_is_the_param():
    error = InputsTooLong(limit=8, over=[("input[3]", 12), ("input[7]", 30)])
    assert error.param == "input[3]" and error.code == "context_length_exceeded"
    assert error.message.startswith("input[3] is 12 tokens and input[7] is 30 tokens: over")
    assert "never truncated" in error.message
    many = InputsTooLong(limit=8, over=[(f"input[{i}]", 9) for i in range(20)])
    assert "input[15] is 9 tokens (and 4 more)" in many.message and "input[16]" not in many.message
