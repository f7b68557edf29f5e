"""Acceptance: a data directory shared with an earlier installation of millm (another checkout, an
older environment) that registered the demo SAE and transcoder set from its own copies, since
removed: the next start reads this installation's copies, so the demo server is steered as the
README promises instead of starting with no SAE attached, and its transcoder set can be read."""

import httpx
import pytest

from millm.kernel.model.shipped import DEMO_SAE, SHIPPED_TRANSCODERS
from millm.settings import DEMO_MODEL_NAME
from millm.store.database import Store, database_url
from millm.store.saes import add_sae, sae_rows
from millm.store.settings import get_setting, set_setting
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
