"""Registrations clients ask for over HTTP: SAEs and models, their paths confined first.

The registries themselves also serve the server's own registrations (the demo SAE from the
package, the start-up model), which no confinement applies to; this is the clients' door.
"""

from __future__ import annotations

from pathlib import Path

from millm.engine.sources import ModelSource
from millm.errors import InvalidRequest
from millm.interp import sae_releases
from millm.interp.sae_files import SAEInfo
from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.model.paths import PathPolicy, inside, is_hub_id, resolved
from millm.kernel.model.registry import ModelRegistry, RegisteredModel, canonical_reference
from millm.kernel.model.sae_specs import SAESpec
from millm.kernel.model.shipped import SHIPPED_DIR
from millm.kernel.steering.saes import SAERegistry
from millm.settings import Settings


def local_files(source: ModelSource) -> Path | None:
    """The start-up model's checkpoint directory or .gguf file, when it is local."""
    return Path(canonical_reference(source)) if source.kind in ("directory", "gguf") else None


class ClientRegistrations:
    """Register what a client names, after the path policy has let it through (blocking calls)."""

    def __init__(
        self,
        settings: Settings,
        startup: ModelSource,
        saes: SAERegistry,
        models: ModelRegistry,
        calibrations: CalibrationBook,
    ):
        self.paths = PathPolicy(settings.home, settings.allowed_paths, local_files(startup))
        self.saes, self.models, self.calibrations = saes, models, calibrations

    def sae(
        self,
        path: str | None,
        repo: str | None,
        revision: str | None,
        release: str | None = None,
        sae_id: str | None = None,
    ) -> tuple[SAEInfo, bool]:
        """A local `path` inside the allowed directories, a hub `repo` with `path` inside it, or a
        SAELens `release` and its `sae_id`; 403 path_not_allowed before anything is read."""
        if release is not None:
            published = sae_releases.find(release, sae_id or "")
            self.paths.hub_part(revision, "revision")
            return self.saes.register(None, published.repo, published.path, revision, published)
        if repo:
            if not is_hub_id(repo):
                raise InvalidRequest(
                    f"repo {repo!r} is not a Hugging Face hub id (owner/name)", param="repo"
                )
            self.paths.hub_part(path, "path")
            self.paths.hub_part(revision, "revision")
            return self.saes.register(None, repo, path, revision)
        if not path:
            raise InvalidRequest("give path (a local SAE) or repo (+ path inside it)", param="path")
        registered = self.saes.register(str(self.sae_readable(path)), None, None, revision)
        # a calibration.json shipped beside the weights
        self.calibrations.import_shipped(registered[0])
        return registered

    def startup_sae(self, spec: SAESpec) -> SAEInfo:
        """An SAE named on the command line (`--sae`): no path confinement, as for --model."""
        if spec.release is not None:
            published = sae_releases.find(spec.release, spec.sae_id or "")
            info, _ = self.saes.register(None, published.repo, published.path, None, published)
            return info
        if spec.repo is not None:
            return self.saes.register(None, spec.repo, spec.repo_path, spec.revision)[0]
        info, _ = self.saes.register(spec.path, None, None, None)
        self.calibrations.import_shipped(info)
        return info

    def model(self, reference: str, name: str | None) -> tuple[RegisteredModel, bool]:
        """A local source only inside the allowed directories, else a hub id looked up on the hub
        alone; 403 path_not_allowed otherwise."""
        local = self.paths.model_reference(reference, "source")
        return self.models.register(reference, name, local=local)

    def sae_readable(self, path: str) -> Path:
        """`path` resolved, or 403 path_not_allowed unless this replica may read an SAE file there
        (another replica's allowed paths may differ); what ships with millm is always readable
        (the demo transcoder set's files register as SAEs)."""
        found = resolved(path)
        if found is not None and inside(found, (SHIPPED_DIR,)):
            return found
        return self.paths.local(path, "path")
