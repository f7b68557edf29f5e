"""The demo set-up: on the first start with the demo model, register and attach the demo SAE and
import the demo profiles. Done once (remembered in the store), so a user's later detach or
deleted profile stays as the user left it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from millm.engine.loader import LoadedModel
from millm.errors import MillmError

log = logging.getLogger(__name__)

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"
DEMO_SAE = DEMO_DIR / "sae" / "smollm2-135m-topk"
DEMO_PROFILES = DEMO_DIR / "profiles"


def install_demo(state, lm: LoadedModel) -> None:
    """Register + attach the demo SAE and import the demo profiles, once per data directory."""
    if state.store.get_setting("demo_installed", False) or not DEMO_SAE.is_dir():
        return
    try:
        info, _ = state.saes.register(str(DEMO_SAE), None, None, None)
        state.calibrations.import_shipped(info)  # the demo SAE ships calibrated on the demo model
        if info.id not in state.steering.attached:
            state.steering.attach(lm, info.id, None)
        taken = {row["name"] for row in state.profiles.all()}
        for path in sorted(DEMO_PROFILES.glob("*.json")):
            document = json.loads(path.read_text())
            if document.get("name") not in taken:
                state.profiles.import_documents(document, on_conflict="fail")
    except MillmError as exc:
        log.error("the demo SAE could not be set up: %s", exc.message)
        return
    state.store.set_setting("demo_installed", True)
    log.info("demo SAE %s attached at layer %s; demo profiles imported", info.id, info.layer)
