"""The label embeddings kept for search by meaning (lab/labels/meaning.py): made in batches
of EMBED_BATCH with progress after each, made once when two callers ask together (the second
waits for the first's), kept per SAE, embedder and labels version, and made again after a
failure stops the first maker. The embedder is a small deterministic one (a hash of each text):
what is under test is the book, not an embedding model."""

from __future__ import annotations

import threading
import time
import zlib

import numpy as np
import pytest

from millm.kernel.books.label_search import FeatureMatch
from millm.lab.labels.meaning import EMBED_BATCH, MeaningBook, unit


class Hashed:
    """Each text's vector from a seed of its CRC; records every batch it is asked for."""

    name = "hashed"

    def __init__(self, pause: float = 0.0, fail_at: int | None = None):
        self.batches: list[int] = []
        self.pause, self.fail_at = pause, fail_at

    def vectors(self, texts: list[str]) -> np.ndarray:
        if self.fail_at is not None and len(self.batches) == self.fail_at:
            self.batches.append(-1)
            raise RuntimeError("the embedder is down")
        self.batches.append(len(texts))
        time.sleep(self.pause)
        return np.stack(
            [np.random.default_rng(zlib.crc32(t.encode())).normal(size=8) for t in texts]
        )


ROWS = [FeatureMatch(index=i, label=f"label {i}", score=None, source="plain") for i in range(300)]


def test_labels_are_embedded_in_batches_with_progress_and_kept():
    book, embedder, heard = MeaningBook(), Hashed(), []
    held = book.embedded(embedder, "sae", 1, ROWS, heard.append)
    assert embedder.batches == [EMBED_BATCH, EMBED_BATCH, 300 - 2 * EMBED_BATCH] == heard
    want = unit(Hashed().vectors([row.label for row in ROWS]))
    assert np.allclose(held.vectors, want) and held.matches == ROWS
    assert book.embedded(embedder, "sae", 1, ROWS) is held  # kept: nothing embedded again
    assert len(embedder.batches) == 3
    book.embedded(embedder, "sae", 2, ROWS)  # another labels version is embedded anew
    assert len(embedder.batches) == 6


def test_a_second_caller_waits_for_the_first_ones_embeddings():
    book, embedder = MeaningBook(), Hashed(pause=0.05)
    found: list = []
    first = threading.Thread(target=lambda: found.append(book.embedded(embedder, "s", 1, ROWS)))
    first.start()
    time.sleep(0.02)
    found.append(book.embedded(embedder, "s", 1, ROWS))
    first.join()
    assert found[0] is found[1] and len(embedder.batches) == 3


def test_a_failed_making_is_made_again_by_the_next_caller():
    book, broken = MeaningBook(), Hashed(fail_at=1)
    with pytest.raises(RuntimeError, match="down"):
        book.embedded(broken, "s", 1, ROWS)
    working = Hashed()
    held = book.embedded(working, "s", 1, ROWS)
    assert working.batches == [EMBED_BATCH, EMBED_BATCH, 300 - 2 * EMBED_BATCH]
    assert held.vectors.shape == (300, 8)
