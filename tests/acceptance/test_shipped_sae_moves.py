"""Acceptance: a data directory shared with an earlier installation of millm (another checkout, an
older environment) that registered the demo SAE and transcoder set from its own copies, since
removed: the next start reads this installation's copies, so the demo server is steered as the
README promises instead of starting with no SAE attached, and its transcoder set can be read."""

import json

import httpx
import pytest

from millm.kernel.model.shipped import DEMO_PROFILES, DEMO_SAE, SHIPPED_TRANSCODERS
from millm.settings import DEMO_MODEL_NAME
from millm.store.database import Store, database_url
from millm.store.profiles import delete_profile, profile_rows, update_profile, upgrade_profiles
from millm.store.saes import add_sae, remove_sae, sae_rows
from millm.store.settings import get_setting, set_setting
from millm.store.steering import set_attachment, write_features
from millm.store.transcoders import (
    delete_transcoder_set,
    insert_transcoder_set,
    transcoder_set_rows,
)
from tests.support.model_cache import start_sharing
from tests.support.server import ServerProcess

pytestmark = pytest.mark.acceptance
SAE = "sae_262743630f92"


def test_the_demo_sae_follows_the_installation(tmp_path):
    home = tmp_path / "home"
    start_sharing("demo", home, []).stop()  # the first start registers and attaches the demo SAE
    store = Store(database_url(home, None))
    try:
        [row] = [r for r in sae_rows(store) if r["id"] == SAE]
        assert row["path"] == str(DEMO_SAE.resolve())
        add_sae(store, {**row, "path": str(tmp_path / "old-checkout" / DEMO_SAE.name)})
        # The transcoder set's id is its path: the earlier installation's copy was another set.
        shipped, setting = SHIPPED_TRANSCODERS[DEMO_MODEL_NAME]
        [ours] = [r["id"] for r in transcoder_set_rows(store)]
        assert get_setting(store, setting) == [ours]
        delete_transcoder_set(store, ours)
        insert_transcoder_set(
            store, "tc_earlier0000", str(tmp_path / "old-checkout" / shipped.name)
        )
        set_setting(store, setting, ["tc_earlier0000"])
    finally:
        store.close()
    server = ServerProcess(home, []).wait_ready(timeout=600)  # its cache links are in place
    try:
        saes = httpx.get(f"{server.base_url}/api/saes").json()["data"]
        assert [(s["id"], s["attached"], s["attached_layer"]) for s in saes] == [(SAE, True, 12)]
        assert httpx.get(f"{server.base_url}/api/saes/{SAE}").json()["path"] == str(
            DEMO_SAE.resolve()
        )
        assert f"shipped SAE {SAE} is now read from {DEMO_SAE.resolve()}" in server.log
        assert "could not attach" not in server.log
        sets = httpx.get(f"{server.base_url}/api/transcoders").json()["data"]
        assert [(t["id"], t["path"], "error" in t) for t in sets] == [(ours, str(shipped), False)]
        assert (
            "shipped transcoder set tc_earlier0000 of an earlier installation dropped" in server.log
        )
    finally:
        server.stop()


EARLIER = "sae_0123456789ab"  # the id an earlier millm's shipped weights had


def as_set_up_by_an_earlier_millm(home, attached: bool) -> dict[str, dict]:
    """The data directory as an earlier millm left it: its shipped SAE registered from this same
    folder (whose file now holds other weights), attached or detached by the user, with a live
    value, and the shipped profiles made for it: pirate and france as imported, music changed by
    the user, italian-food deleted by the user. Returns the profiles as they were."""
    store = Store(database_url(home, None))
    try:
        [row] = [r for r in sae_rows(store) if r["id"] == SAE]
        set_attachment(store, SAE, None)
        remove_sae(store, SAE)
        add_sae(store, {**row, "id": EARLIER})
        if attached:
            set_attachment(store, EARLIER, 12, DEMO_MODEL_NAME)
        write_features(store, {(EARLIER, 7): {"op": "add", "strength": 3.0, "value": None}})
        rows = {r["name"]: r for r in profile_rows(store)}
        earlier = {
            name: {**row["document"], "steering": [{"sae_id": EARLIER, "layer": 12, "features": [
                {"index": 1574, "op": "add", "strength": 10.0}]}]}
            for name, row in rows.items()
        }  # fmt: skip
        upgrade_profiles(store, {rows[name]["id"]: doc for name, doc in earlier.items()})
        update_profile(store, rows["music"]["id"], lambda d: {**d, "description": "mine"})
        delete_profile(store, rows["italian-food"]["id"])
        return rows
    finally:
        store.close()


@pytest.mark.parametrize("attached", [True, False])
def test_an_earlier_millms_shipped_sae_makes_way_for_this_ones(tmp_path, attached):
    home = tmp_path / "home"
    start_sharing("demo", home, []).stop()
    before = as_set_up_by_an_earlier_millm(home, attached)
    server = ServerProcess(home, []).wait_ready(timeout=600)
    try:
        base = server.base_url
        saes = httpx.get(f"{base}/api/saes").json()["data"]
        layer = 12 if attached else None
        assert [(s["id"], s["attached"], s["attached_layer"]) for s in saes] == [
            (SAE, attached, layer)
        ]
        assert f"shipped SAE {SAE} replaces the earlier shipped {EARLIER}" in server.log
        assert httpx.get(f"{base}/api/saes/{SAE}/calibration").status_code == 200
        live = httpx.get(f"{base}/api/steering").json()["saes"]  # the earlier SAE's value went
        assert [(s["sae_id"], f) for s in live for f in s["features"]] == []
        profiles = {p["name"]: p for p in httpx.get(f"{base}/api/profiles").json()["data"]}
        assert sorted(profiles) == ["france", "music", "pirate"]  # italian-food stays deleted
        for name in ("france", "pirate"):  # as imported: the new documents, the same profiles
            shipped = json.loads((DEMO_PROFILES / f"{name}.json").read_text())
            got = profiles[name]
            assert got["id"] == before[name]["id"] and got["revision"] == 1
            assert [s["sae_id"] for s in got["document"]["steering"]] == [SAE]
            assert got["document"]["steering"][0]["features"] == [
                {**f, "op": "add"} for f in shipped["steering"][0]["features"]
            ]
        music = profiles["music"]["document"]  # the user's change stays
        assert music["description"] == "mine" and music["steering"][0]["sae_id"] == EARLIER
        assert "profile 'music' was made for the earlier shipped SAE and changed since" in (
            server.log
        )
        if attached:  # the demo is steered again: a profile request reaches the new SAE
            question = [{"role": "user", "content": "Tell me about your weekend."}]
            body = {"model": DEMO_MODEL_NAME, "profile": "pirate", "max_tokens": 8}
            body["messages"] = question
            reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)
            assert reply.headers["x-millm-steering"].startswith("profile;")
    finally:
        server.stop()
