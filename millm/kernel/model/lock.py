"""The steering lock: while SAEs steer one model, the server serves only that model. Kept in the
store, so a restart on the same model keeps it. The switch holds its mutex around every call."""

from __future__ import annotations

import logging

from millm.errors import Conflict, ModelLocked
from millm.store.database import Store
from millm.store.settings import get_setting, set_setting

log = logging.getLogger(__name__)

LOCK_KEY = "model_lock"


class SteeringLock:
    """The locked model's name (None: unlocked), and the rules for changing it."""

    def __init__(self, store: Store, startup_name: str):
        self.store = store
        self.name: str | None = get_setting(store, LOCK_KEY)
        if self.name is not None and self.name != startup_name:
            # The operator's --model is explicit; a lock left by an earlier run on another model
            # yields to it.
            log.warning(
                "steering lock on %r released: this server was started with %r",
                self.name,
                startup_name,
            )
            self.set(None)

    def set(self, name: str | None) -> None:
        """Change the lock, stored."""
        if self.name != name:
            self.name = name
            set_setting(self.store, LOCK_KEY, name)

    def refuses(self, name: str) -> ModelLocked | None:
        """The refusal of a request or a load for `name`, if the lock is on another model."""
        if self.name is None or name == self.name:
            return None
        return ModelLocked(
            f"the server is locked to model {self.name!r} for steering, so {name!r} is not loaded; "
            f"POST /api/models/{self.name}/unlock (after detaching its SAEs) to serve other models",
            param="model",
        )

    def lock(self, name: str) -> None:
        """Serve only `name` (refused while locked to another)."""
        if self.name is not None and self.name != name:
            raise ModelLocked(
                f"the server is locked to model {self.name!r} for steering; "
                f"unlock it before locking {name!r}",
                param="model",
            )
        self.set(name)

    def unlock(self, name: str, attached: list[str]) -> bool:
        """Release the lock on `name`, refused while SAEs are `attached`; whether it was locked."""
        if self.name is None:
            return False
        if self.name != name:
            raise ModelLocked(
                f"the server is locked to model {self.name!r}, not {name!r}", param="model"
            )
        if attached:
            raise Conflict(
                f"model {name!r} stays locked while SAEs are attached ({', '.join(attached)}); "
                "detach them first",
                param="model",
                code="sae_attached",
            )
        self.set(None)
        return True
