"""The packaged models' set-up: on the first start with a packaged model (the demo, gemma3-270m),
register and attach the SAE shipped for it, import its profiles and register its transcoder set.
Done once per model (remembered in the store), so a user's later detach, deleted profile or
deleted set stays as the user left it. A newer millm that ships other SAE weights takes the place
of the earlier shipped SAE (see `Shipped.upgrade`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from millm.engine.loader import LoadedModel
from millm.engine.sources import GEMMA3_MODEL_NAME
from millm.errors import Conflict, MillmError, NotFound
from millm.formats.profiles import validate_profile
from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.books.transcoders import TranscoderBook, set_id
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry
from millm.settings import DEMO_MODEL_NAME
from millm.store.database import Store
from millm.store.profiles import upgrade_profiles
from millm.store.settings import get_setting, set_setting

log = logging.getLogger(__name__)

DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"
SHIPPED_DIR = DEMO_DIR  # the SAEs and profiles inside the package: always readable
DEMO_SAE = DEMO_DIR / "sae" / "smollm2-135m-topk"
DEMO_PROFILES = DEMO_DIR / "profiles"
GEMMA3_SAE = DEMO_DIR / "sae" / "gemma3-270m-topk"
# The transcoder sets shipped for packaged models, and the setting that says one was registered
# (its own: data directories set up before the set shipped get it on their next start).
SHIPPED_TRANSCODERS = {
    DEMO_MODEL_NAME: (
        DEMO_DIR / "transcoders" / "smollm2-135m-jumprelu",
        "demo_transcoders_installed",
    ),
}
# Each packaged model: its SAE, its profiles (or None), and the store setting that says it was set
# up.
SHIPPED = {
    DEMO_MODEL_NAME: (DEMO_SAE, DEMO_PROFILES, "demo_installed"),
    GEMMA3_MODEL_NAME: (GEMMA3_SAE, None, "gemma3_installed"),
}


class Shipped:
    """Sets up the packaged models' SAEs and profiles through the books that keep them."""

    def __init__(
        self,
        store: Store,
        saes: SAERegistry,
        calibrations: CalibrationBook,
        steering: Steering,
        profiles: ProfileBook,
        transcoders: TranscoderBook,
    ):
        self.store, self.saes, self.calibrations = store, saes, calibrations
        self.steering, self.profiles, self.transcoders = steering, profiles, transcoders

    def install(self, lm: LoadedModel) -> None:
        """Register + attach the SAE shipped for this packaged model and import its profiles,
        once per data directory."""
        self.install_transcoders(lm)
        if lm.source.name not in SHIPPED:
            return
        sae_dir, profiles_dir, setting = SHIPPED[lm.source.name]
        if get_setting(self.store, setting, False) or not sae_dir.is_dir():
            return
        try:
            info, _ = self.saes.register(str(sae_dir), None, None, None)
            # the demo SAE ships calibrated on the demo model
            self.calibrations.import_shipped(info)
            if info.id not in self.steering.attached:
                self.steering.attach(lm, info.id, None)
            taken = {row["name"] for row in self.profiles.all()}
            for path in sorted(profiles_dir.glob("*.json")) if profiles_dir is not None else []:
                document = json.loads(path.read_text())
                if document.get("name") not in taken:
                    self.profiles.import_documents(document, on_conflict="fail")
        except MillmError as exc:
            log.error("the SAE shipped for %s could not be set up: %s", lm.source.name, exc.message)
            return
        set_setting(self.store, setting, True)
        log.info("shipped SAE %s attached to %s at layer %s", info.id, lm.source.name, info.layer)

    def relocate(self, lm: LoadedModel) -> None:
        """The SAE shipped for this packaged model, registered from where millm was installed
        before (another checkout or environment sharing the data directory, since moved or
        removed): its registration moves to this installation's copy, so its stored attachment
        restores instead of leaving the demo unsteered."""
        if lm.source.name not in SHIPPED:
            return
        sae_dir, _, setting = SHIPPED[lm.source.name]
        if not get_setting(self.store, setting, False) or not sae_dir.is_dir():
            return  # not installed yet: install() registers it from here
        try:
            moved = self.saes.relocate(sae_dir.resolve())
        except MillmError as exc:
            log.error("the SAE shipped for %s could not be read: %s", lm.source.name, exc.message)
            return
        if moved is not None:
            log.info("shipped SAE %s is now read from %s", moved.id, moved.path)

    def upgrade(self, lm: LoadedModel) -> None:
        """This installation ships other weights for the packaged model's SAE than the data
        directory set up (a newer millm retrained it): the earlier shipped SAE, whose file is gone
        or now holds the new weights, makes way for this one. It is registered with its shipped
        calibration and attached where the earlier one was attached (left detached if the user
        had detached it), and each shipped profile made for the earlier SAE and never changed
        since (revision 1) takes the new document of its name; a profile the user changed, or
        deleted, stays as the user left it."""
        if lm.source.name not in SHIPPED:
            return
        sae_dir, profiles_dir, setting = SHIPPED[lm.source.name]
        if not get_setting(self.store, setting, False) or not sae_dir.is_dir():
            return
        try:
            current = self.saes.peek(sae_dir.resolve())
        except MillmError as exc:
            log.error("the SAE shipped for %s could not be read: %s", lm.source.name, exc.message)
            return
        stale = [
            info
            for info in self.saes.infos.values()
            if Path(info.path).name == sae_dir.name and info.id != current.id
            and not self.saes.readable(info.id)
        ]  # fmt: skip
        if not stale:
            return
        gone = {info.id for info in stale}
        attached = any(sae_id in self.steering.stored for sae_id in gone)
        try:
            for sae_id in gone:  # as DELETE /api/saes/{id} forgets one: its live values too
                self.steering.detach(sae_id)
                self.steering.set_features({}, clear=sae_id)
                self.saes.forget(sae_id)
            info, _ = self.saes.register(str(sae_dir), None, None, None)
            self.calibrations.import_shipped(info)
            if attached and info.id not in self.steering.attached:
                self.steering.attach(lm, info.id, None)
        except MillmError as exc:
            log.error("the SAE shipped for %s could not be set up: %s", lm.source.name, exc.message)
            return
        log.info("shipped SAE %s replaces the earlier shipped %s", info.id, ", ".join(sorted(gone)))
        if profiles_dir is not None:
            self._upgrade_profiles(profiles_dir, gone)

    def _upgrade_profiles(self, profiles_dir: Path, gone: set[str]) -> None:
        """The shipped profiles made for an earlier shipped SAE and never changed take this
        installation's documents (their revision stays 1: a later upgrade knows them again)."""
        rows = {row["name"]: row for row in self.profiles.all()}
        documents = {}
        for path in sorted(profiles_dir.glob("*.json")):
            document = json.loads(path.read_text())
            row = rows.get(document.get("name"))
            if row is None:
                continue  # never imported, or deleted by the user: left so
            steered = {entry.get("sae_id") for entry in row["document"].get("steering", [])}
            if not steered or not steered <= gone:
                continue  # not made for the earlier shipped SAE
            if row["revision"] != 1:
                log.warning(
                    "profile %r was made for the earlier shipped SAE and changed since: left as "
                    "it is (the shipped one for the new SAE is %s)",
                    row["name"],
                    path,
                )
                continue
            documents[row["id"]] = validate_profile(document)
        if documents:
            upgrade_profiles(self.store, documents)
            self.profiles.refresh()
            log.info(
                "shipped profiles %s now steer the new shipped SAE",
                sorted(row["name"] for row in rows.values() if row["id"] in documents),
            )

    def install_transcoders(self, lm: LoadedModel) -> None:
        """Register the transcoder set shipped for this packaged model, once per installation: a
        set's id is its path, so another checkout's copy is another set. The setting keeps the ids
        installed, so a copy the user deleted stays deleted; an earlier installation's copy that
        can no longer be read (that checkout was removed) is dropped."""
        directory, setting = SHIPPED_TRANSCODERS.get(lm.source.name, (None, ""))
        if directory is None or not directory.is_dir():
            return
        key = set_id(directory)
        installed = get_setting(self.store, setting, [])
        if installed is True:
            # Set before installations were told apart, by whichever ran first: the shipped
            # copies registered are the sets of the same folder name.
            ids = [
                v["id"] for v in self.transcoders.sets() if Path(v["path"]).name == directory.name
            ]
        else:
            ids = list(installed)
        for other in ids:
            if other != key:
                self._drop_if_unreadable(other)
        if key in ids:
            if ids != installed:
                set_setting(self.store, setting, ids)
            return
        try:
            registered = self.transcoders.register(directory, lm)
        except MillmError as exc:
            log.error(
                "the transcoder set shipped for %s could not be registered: %s",
                lm.source.name,
                exc.message,
            )
            return
        set_setting(self.store, setting, [*ids, key])
        log.info("shipped transcoder set %s registered for %s", registered.id, lm.source.name)

    def _drop_if_unreadable(self, key: str) -> None:
        """Forget an earlier installation's shipped set whose files are gone or changed."""
        try:
            self.transcoders.get(key)
        except NotFound:
            return
        except Conflict as exc:
            self.transcoders.delete(key)
            log.info(
                "shipped transcoder set %s of an earlier installation dropped: %s", key, exc.message
            )
