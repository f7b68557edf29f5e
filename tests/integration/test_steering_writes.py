"""A steering write: the writer's copy takes the change as written (no read of the whole state),
equal to what a fresh read of the store finds; a write after another replica's falls back to one."""

import pytest
from sqlalchemy import event

from millm.interp.steering import FeatureOp
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry
from millm.store.database import Store, database_url
from millm.store.steering import write_features
from tests.support.tiny_saes import build_saelens


@pytest.fixture
def world(llama_lm, tmp_path):
    store = Store(database_url(tmp_path, None))
    registry = SAERegistry(store, tmp_path / "hub", LabelBook(store))
    steering = Steering(store, registry, ProfileBook(store))
    ids = []
    for layer in (1, 2):
        info, _ = registry.register(
            str(build_saelens(tmp_path / f"sae{layer}", layer=layer, seed=60 + layer)),
            None,
            None,
            None,
        )
        steering.attach(llama_lm, info.id, None)
        ids.append(info.id)
    yield store, registry, steering, ids
    store.close()


def as_read(steering: Steering) -> tuple:
    return steering.version, steering.enabled, steering.active, steering.features, steering.stored


def fresh(store: Store, registry: SAERegistry) -> tuple:
    """The state as a new process reads it from the store."""
    return as_read(Steering(store, registry, ProfileBook(store)))


def whole_reads(store: Store) -> list[str]:
    """SELECTs of the live values table from now on (the whole-state read is the one that makes
    them)."""
    seen: list[str] = []
    event.listen(
        store.engine,
        "before_cursor_execute",
        lambda conn, cursor, statement, *rest: (
            seen.append(statement)
            if statement.lstrip().upper().startswith("SELECT") and "millm_strengths" in statement
            else None
        ),
    )
    return seen


def test_each_write_is_taken_as_written_without_reading_the_state_back(world, llama_lm):
    store, registry, steering, (first, second) = world
    reads = whole_reads(store)
    writes = [
        lambda: steering.set_features({(first, 3): 12.5, (first, 4): FeatureOp("cap", value=2.0)}),
        lambda: steering.set_features(
            {(second, 5): FeatureOp("cap", value=1.0), (second, 6): FeatureOp("ablate")}
        ),
        # both cleared: the SAE's entry goes
        lambda: steering.set_features({(first, 3): None, (first, 4): 0.0}),
        lambda: steering.set_features({(first, 7): -30.0}, clear=second),
        lambda: steering.set_enabled(False),
        lambda: steering.set_active("profile", "prof_x"),
        lambda: steering.set_active(None, None),
        lambda: steering.detach(second),
        lambda: steering.attach(llama_lm, second, None),
        lambda: steering.set_features({}, clear=True),
        steering.bump,
    ]
    for number, write in enumerate(writes, start=1):
        before = steering.version
        write()
        assert steering.version == before + 1, number
        assert reads == [], f"write {number} read the whole state back"
        assert as_read(steering) == fresh(store, registry), number
        reads.clear()  # the fresh read above made its own
    assert steering.features == {} and steering.enabled is False and steering.active is None
    assert steering.stored == {first: (1, llama_lm.name), second: (2, llama_lm.name)}


def test_a_write_after_another_replicas_reads_the_whole_state(world):
    store, registry, steering, (first, second) = world
    # another replica's write
    write_features(store, {(second, 9): {"op": "add", "strength": 4.0, "value": None}})
    reads = whole_reads(store)
    steering.set_features({(first, 2): 8.0})
    assert reads, "the version moved by two: the copy must read what the other replica wrote"
    assert as_read(steering) == fresh(store, registry)
    assert steering.features[second][9] == FeatureOp("add", 4.0) and steering.features[first][
        2
    ] == FeatureOp("add", 8.0)
