"""The applied steering set's canonical hash: the four test vectors of the original miLLM's header
specification, hashed exactly."""

from __future__ import annotations

import pytest

from millm.interp.steering_hash import applied_set, steering_set_hash

LFM = "LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11"
GEMMA = "jbloom--gemma-2-2b-res-jb--layer_20--width_16k--average_l0_71"


@pytest.mark.parametrize(
    ("sae", "features", "expected"),
    [
        (LFM, [(1234, 8.0)], "a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105"),
        (LFM, [(1234, -8.0)], "cc6c48faa720096e5c65fc1b2afab1b9b87659fb4465f20db421a2ed7fed78a7"),
        (
            GEMMA,
            [(77, -2.5), (5, 0.1), (900, 0.0), (12, -0.0)],
            "b843912201c5c18f872976e35af288e5f484d81e31a03a1dc16c3b9dbd82e710",
        ),
        (GEMMA, [(3, 500.0)], "3f51779e6e33ee248acf6f520cb9475b4ef62f68275060bb69d2e228033b78df"),
    ],
    ids=["TV-1", "TV-2", "TV-3", "TV-4"],
)
def test_the_four_vectors_hash_exactly(sae, features, expected):
    assert steering_set_hash(sae, features) == f"sha256:{expected}"


def test_the_applied_set_is_clamped_sorted_and_without_zeros():
    assert applied_set([(77, -2.5), (5, 0.1), (900, 0.0), (12, -0.0), (3, -500.0)]) == [
        (3, -200.0),
        (5, 0.1),
        (77, -2.5),
    ]
    assert steering_set_hash("s", [(2, 1.0), (1, 2.0)]) == steering_set_hash(
        "s", [(1, 2.0), (2, 1.0)]
    )
    assert steering_set_hash("s", [(1, 2.0)]) != steering_set_hash("t", [(1, 2.0)])
