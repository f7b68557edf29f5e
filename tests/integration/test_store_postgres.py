"""The same store and the same server state on PostgreSQL (DATABASE_URL), with a real server
process."""

import httpx
import pytest

from millm.store.database import Store
from millm.store.labels import (
    clear_labels,
    label_count,
    label_rows,
    labels_seeded,
    merge_labels,
    replace_labels,
    seed_labels,
)
from millm.store.profiles import insert_profiles, profile_rows
from millm.store.settings import get_setting
from millm.store.steering import live_features, write_features
from tests.support.postgres import binaries
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

pytestmark = pytest.mark.skipif(binaries() is None, reason="PostgreSQL binaries are not installed")


def test_store_round_trip_on_postgres(postgres):
    store = Store(postgres.url)
    version = write_features(
        store,
        {("sae_x", 1): {"op": "add", "strength": 2.5}, ("sae_x", 2): {"op": "cap", "value": 4.0}},
    )
    insert_profiles(store, [("prof_pg", {"name": "pg-profile", "steering": []})])
    store.close()
    again = Store(postgres.url)
    assert live_features(again)["sae_x"] == {
        1: {"op": "add", "strength": 2.5, "value": None},
        2: {"op": "cap", "strength": 0.0, "value": 4.0},
    }
    assert [p["name"] for p in profile_rows(again)] == ["pg-profile"]
    assert get_setting(again, "steering_version") == version == 1
    again.close()


def test_label_store_on_postgres(postgres):
    labels = Store(postgres.url)
    # more than one IN (...) chunk
    rows = [(i, f"label {i}", "plain", {"top_tokens": [f"t{i}"]}) for i in range(1200)]
    assert replace_labels(labels, "sae_pg", rows) == (0, 1200)
    assert merge_labels(
        labels, "sae_pg", [(i, "new", "neuronpedia", {}) for i in range(1100, 1300)]
    ) == (100, 1300)
    again = Store(postgres.url)
    stored = label_rows(again, "sae_pg")
    assert len(stored) == 1300 and (stored[5].label, stored[5].detail, stored[1150].source) == (
        "label 5",
        {"top_tokens": ["t5"]},
        "neuronpedia",
    )
    # labels were there: kept, and seeded once
    assert seed_labels(again, "sae_pg", rows[:1]) is False and labels_seeded(again, "sae_pg")
    assert clear_labels(again, "sae_pg") == 1300 and label_count(again, "sae_pg") == 0


def test_server_state_lives_in_postgres(postgres, tiny_dirs, tmp_path):
    sae_dir = build_saelens(tmp_path / "sae", layer=1, seed=21)
    env = {"DATABASE_URL": postgres.url}
    first = ServerProcess(
        tmp_path / "home-a", ["--model", str(tiny_dirs["llama"])], env=env
    ).wait_ready()
    try:
        sae = httpx.post(f"{first.base_url}/api/saes", json={"path": str(sae_dir)}).json()["id"]
        httpx.post(f"{first.base_url}/api/saes/{sae}/attach")
        httpx.put(f"{first.base_url}/api/steering/saes/{sae}/features/4", json={"strength": 6})
        httpx.post(f"{first.base_url}/api/profiles", json={"name": "shared", "steering": []})
    finally:
        first.stop()
    # Another data directory, same database: the state follows the database, not the folder.
    second = ServerProcess(
        tmp_path / "home-b", ["--model", str(tiny_dirs["llama"])], env=env
    ).wait_ready()
    try:
        state = httpx.get(f"{second.base_url}/api/steering").json()
        mine = [(s["attached"], s["features"]) for s in state["saes"] if s["sae_id"] == sae]
        assert mine == [(True, [{"index": 4, "op": "add", "strength": 6.0}])]
        assert "shared" in [
            p["name"] for p in httpx.get(f"{second.base_url}/api/profiles").json()["data"]
        ]
    finally:
        second.stop()
