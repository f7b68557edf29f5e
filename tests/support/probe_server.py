"""The server the probe tests share: the tiny Llama with two SAEs registered, a TopK one at layer 1
attached (`process.sae`) and a standard one at layer 2 left detached (`process.other`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.api.clients import post
from tests.support.server import ServerProcess
from tests.support.tiny_saes import build_saelens


def probe_saes(base: Path) -> dict[str, Path]:
    """The two SAEs' folders: `main` (layer 1, TopK) and `other` (layer 2, standard)."""
    return {
        "main": build_saelens(base / "main", layer=1, architecture="topk", seed=61),
        "other": build_saelens(base / "other", layer=2, architecture="standard", seed=62),
    }


@contextmanager
def probe_server(home: Path, model: Path, saes: dict[str, Path]) -> Iterator[ServerProcess]:
    """A ready server on `model` with both SAEs registered and `main` attached; stopped after."""
    process = ServerProcess(home, ["--model", str(model)]).wait_ready()
    try:
        process.sae = post(process, "/api/saes", {"path": str(saes["main"])}).json()["id"]
        process.other = post(process, "/api/saes", {"path": str(saes["other"])}).json()["id"]
        assert post(process, f"/api/saes/{process.sae}/attach", {}).status_code == 200
        yield process
    finally:
        process.stop()
