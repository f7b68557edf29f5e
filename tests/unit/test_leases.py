"""Model leases without a server: granting, the id kept as a digest, lazy expiry on the monotonic
clock, renewal from now, release, what a lease refuses, and what an ended id says."""

from datetime import UTC, datetime, timedelta

import pytest

from millm.errors import LeaseExpired, LeaseNotFound, ModelLeased
from millm.kernel.model.leases import MAX_ENDED, LeaseBook, digest


class Clocks:
    """A monotonic and a wall clock the test moves."""

    def __init__(self):
        self.now = 1000.0
        self.start = datetime(2026, 12, 7, tzinfo=UTC)

    def mono(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.start + timedelta(seconds=self.now - 1000.0)


@pytest.fixture
def clocks():
    return Clocks()


@pytest.fixture
def book(clocks):
    return LeaseBook(clock=clocks.mono, wall=clocks.wall)


def test_a_grant_shows_its_id_once_and_keeps_only_its_digest(book):
    token, status = book.grant("m", "batch-runner", "scoring 50k rows", 60)
    assert len(token) == 32 and "lease_id" not in status and token not in str(status)
    assert status["expires_at"] == "2026-12-07T00:01:00Z" and status["seconds_remaining"] == 60
    lease = book.live("m")
    assert lease is not None and lease.digest == digest(token) and token not in repr(lease)
    with pytest.raises(ModelLeased) as info:
        book.grant("m", "someone-else", "x", 60)
    assert "leased by 'batch-runner' until 2026-12-07T00:01:00Z (scoring 50k rows)" in str(
        info.value
    )


def test_a_lease_refuses_what_takes_its_model_away_unless_its_id_is_sent(book):
    token, _ = book.grant("m", "h", "r", 60)
    assert book.refusal("m", "other", "load", None).code == "model_leased"
    assert book.refusal("m", "m", "unload", "wrong").code == "model_leased"
    assert book.refusal("m", "m", "load", None) is None  # using the leased model is fine
    assert book.refusal("m", "other", "unload", None) is None  # nothing of the lease's
    assert book.refusal("m", "other", "load", token) is None  # the holder's own swap


def test_expiry_is_lazy_on_the_monotonic_clock_and_renewal_counts_from_now(book, clocks):
    token, _ = book.grant("m", "h", "r", 60)
    clocks.now += 50
    renewed = book.renew("m", token, 60, "m")
    assert renewed["expires_at"] == "2026-12-07T00:01:50Z" and renewed["renewed_at"]
    clocks.now += 59
    assert book.live("m") is not None
    clocks.now += 1
    assert book.live("m") is None  # at the deadline it is gone
    assert book.refusal("m", "other", "load", None) is None
    view = book.view("m", "m")
    assert view["lease"] is None and view["last_ended"]["end_reason"] == "expired"
    with pytest.raises(LeaseExpired) as info:
        book.renew("m", token, 60, "m")
    assert "ended (expired)" in info.value.message


def test_release_and_an_unknown_id(book):
    token, _ = book.grant("m", "h", "r", 60)
    with pytest.raises(LeaseNotFound) as info:
        book.release("m", "not-the-id", "m")
    assert "a restart ends every lease" in info.value.message
    with pytest.raises(LeaseNotFound):
        book.release("other", token, "m")  # the id on another model's route reveals nothing
    assert book.release("m", token, "m")["end_reason"] == "released"
    with pytest.raises(LeaseExpired):
        book.release("m", token, "m")


def test_a_lease_ends_when_its_model_leaves(book):
    book.grant("m", "h", "r", 60)
    assert book.live("other") is None  # read after a swap: healed
    assert book.view("m", "other")["last_ended"]["end_reason"] == "model_unloaded"
    book.grant("other", "h", "r", 60)
    book.model_left("other")
    assert book.live("other") is None


def test_only_the_last_ended_leases_are_remembered(book):
    tokens = []
    for i in range(MAX_ENDED + 1):
        token, _ = book.grant("m", f"h{i}", "r", 60)
        book.release("m", token, "m")
        tokens.append(token)
    with pytest.raises(LeaseNotFound):
        book.renew("m", tokens[0], 60, "m")
    with pytest.raises(LeaseExpired):
        book.renew("m", tokens[-1], 60, "m")
