"""The workbench's browser tests: Debian's Chromium (Playwright) against live servers on the tiny
Llama with a TopK SAE attached at layer 1 (its file ships labels: "feature N paris" for every
tenth feature, "feature N river" for the others)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.api.clients import api
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens

LAYER = 1
WIDTH = 128  # the tiny SAE's features


class Workbench:
    """A live server with the tiny SAE attached: its URL, the SAE's id, and the process."""

    def __init__(self, process: ServerProcess, sae: str):
        self.process, self.sae = process, sae
        self.base_url = process.base_url
        self.url = f"{process.base_url}/ui"

    def api(self, method: str, path: str, **kwargs):
        """A direct API call (to set up or check what the page did)."""
        return api(self.process, method, path, **kwargs)


def start_workbench(
    tiny_dirs, home: Path, sae_dir: Path, env: dict[str, str] | None = None, key: str | None = None
) -> Workbench:
    """A server on the tiny Llama with the SAE at `sae_dir` registered and attached."""
    process = ServerProcess(home, ["--model", str(tiny_dirs["llama"])], env=env).wait_ready()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    sae = api(process, "POST", "/api/saes", json={"path": str(sae_dir)}, headers=headers).json()[
        "id"
    ]
    attached = api(process, "POST", f"/api/saes/{sae}/attach", headers=headers)
    assert attached.status_code == 200, attached.text
    return Workbench(process, sae)


@pytest.fixture(scope="session")
def tiny_sae(tmp_path_factory) -> Path:
    """The TopK SAE the workbench tests attach (labels shipped)."""
    return build_saelens(
        tmp_path_factory.mktemp("ui-sae") / "topk", layer=LAYER, architecture="topk", seed=91
    )


@pytest.fixture(scope="session")
def shared_workbench(tiny_dirs, tiny_sae, tmp_path_factory):
    """One server for the workbench modules (a start costs about 10 s); `workbench` resets it per
    module."""
    bench = start_workbench(tiny_dirs, tmp_path_factory.mktemp("ui-home"), tiny_sae)
    try:
        yield bench
    finally:
        bench.process.stop()


def reset(bench: Workbench) -> None:
    """The server as a fresh one is, but for its jobs' history: nothing steers, watches or is stored
    beyond the attached SAE and its shipped labels."""
    for kind in ("profiles", "clusters", "circuits"):
        bench.api("POST", f"/api/{kind}/deactivate")
        for document in bench.api("GET", f"/api/{kind}").json()["data"]:
            assert bench.api("DELETE", f"/api/{kind}/{document['id']}").status_code == 200
    for kind in ("probes", "vectors", "variants", "evaluations"):
        for document in bench.api("GET", f"/api/{kind}").json()["data"]:
            assert bench.api("DELETE", f"/api/{kind}/{document['id']}").status_code == 200
    if not bench.api("GET", f"/api/saes/{bench.sae}").json()["attached"]:
        assert bench.api("POST", f"/api/saes/{bench.sae}/attach").status_code == 200
    bench.api("DELETE", "/api/steering/features")
    bench.api("POST", "/api/steering/enable")
    bench.api("DELETE", f"/api/saes/{bench.sae}/calibration")
    settings = {
        "enabled": False,
        "sae_id": None,
        "features": None,
        "top_k": 5,
        "positions": "completion",
        "percentiles": False,
        "tokens": False,
        "labels": False,
    }
    assert bench.api("PUT", "/api/monitoring", json=settings).status_code == 200, (
        "monitoring settings"
    )
    bench.api("POST", "/api/monitoring/reset")


@pytest.fixture(scope="module")
def workbench(shared_workbench):
    """The shared server, reset to a fresh one's state before each test module."""
    reset(shared_workbench)
    return shared_workbench
