"""Two servers' stores on one PostgreSQL database (two replicas) racing for a layer: the partial
unique index lets one live exclusive claim per layer through, whichever writer comes second is
refused whole, and a claim composed beside it still goes in."""

from __future__ import annotations

import threading

from millm.store.claims import ClaimTaken, add_claims, live_claims
from millm.store.database import Store


def test_two_replicas_cannot_both_claim_a_layer(postgres):
    first, second = Store(postgres.url), Store(postgres.url)
    try:
        outcomes: dict[str, str] = {}
        start = threading.Barrier(2)

        def claim(store: Store, circuit: str) -> None:
            start.wait()
            try:
                add_claims(store, circuit, {4: (False, [1]), 5: (False, [2])})
                outcomes[circuit] = "claimed"
            except ClaimTaken:
                outcomes[circuit] = "refused"

        threads = [
            threading.Thread(target=claim, args=(store, circuit))
            for store, circuit in ((first, "cir_a"), (second, "cir_b"))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(outcomes.values()) == ["claimed", "refused"]
        winner = next(c for c, said in outcomes.items() if said == "claimed")
        assert {(c["circuit_id"], c["layer"]) for c in live_claims(second)} == {
            (winner, 4),
            (winner, 5),
        }
        add_claims(second, "cir_c", {4: (True, [9])})  # composed onto the winner's layer
        assert len(live_claims(first)) == 3
    finally:
        first.close()
        second.close()
