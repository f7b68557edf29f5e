"""Incremental detokenisation concatenates to exactly the full decode, never emitting half
characters."""

import pytest
from transformers import AutoTokenizer

from millm.engine.detokenize import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_dirs["tokenizer"]))


@pytest.mark.parametrize(
    "text", ["Hello! How are you today?", "naïve café über 数字 ✓", "  spaced   out\n\nlines"]
)
def test_deltas_concatenate_to_full_decode(tokenizer, text):
    prompt = tokenizer("The cat runs", add_special_tokens=True)["input_ids"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.push(t) for t in ids] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in d for d in deltas)


def test_incomplete_character_waits_and_is_flushed_at_the_end(tokenizer):
    ids = tokenizer("✓", add_special_tokens=False)["input_ids"]
    assert len(ids) == 3  # three UTF-8 bytes, none merged by this tokenizer
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.push(ids[0]) == ""
    assert detok.push(ids[1]) == ""
    # Generation ended mid-character: what the full decode would show is released.
    assert detok.flush() == tokenizer.decode(ids[:2])
    assert tokenizer.decode(ids[:2]).endswith("\ufffd")


def test_special_tokens_are_not_emitted(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [])
    assert detok.push(tokenizer.convert_tokens_to_ids("<|im_end|>")) == ""
