"""The SAE registry: what SAE files the server knows, read once and remembered in the store."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from millm.engine.sources import hub_cache_dirs
from millm.errors import InvalidRequest, MillmError, NotFound, describe
from millm.interp.formats import SAELENS_CONFIG, SAELENS_WEIGHTS, read_sae
from millm.interp.sae import SAE
from millm.interp.sae_files import LABELS_FILE, SAEInfo
from millm.interp.sae_layouts import LAYOUT_FILES
from millm.interp.sae_releases import PublishedSAE
from millm.kernel.books.labels import LabelBook
from millm.store.database import Store
from millm.store.saes import add_sae, remove_sae, sae_rows

log = logging.getLogger(__name__)
# The files an SAE's hub folder may hold, in any layout millm reads (and its labels).
HUB_SAE_PATTERNS = [SAELENS_CONFIG, SAELENS_WEIGHTS, LABELS_FILE, *LAYOUT_FILES]


class SAERegistry:
    """Registered SAEs by id (a hash of the weights file); their labels are in the LabelBook."""

    def __init__(self, store: Store, hub_dir: Path, labels: LabelBook):
        self.store = store
        self.hub_dir = hub_dir
        self.book = labels
        self.infos: dict[str, SAEInfo] = {d["id"]: SAEInfo(**d) for d in sae_rows(store)}
        for (
            info
        ) in self.infos.values():  # registered before labels were stored: their own labels, once
            labels.seed_quietly(info)

    def reload(self) -> None:
        """Read the registrations again: another replica registered or forgot one."""
        self.infos = {d["id"]: SAEInfo(**d) for d in sae_rows(self.store)}

    def get(self, sae_id: str, read_through: bool = True) -> SAEInfo:
        """The SAE's info, or 404 sae_not_found. An id not known here is looked up in the store once
        more first (another replica may have registered it a moment ago, before its notice arrived),
        unless `read_through` is False: the event loop never reads the store."""
        info = self.infos.get(sae_id)
        if info is None and read_through:
            self.reload()
            info = self.infos.get(sae_id)
        if info is None:
            raise NotFound(f"no SAE {sae_id!r} is registered", param="sae_id", code="sae_not_found")
        return info

    def load(self, sae_id: str) -> SAE:
        """The SAE's weights, read from its file (400 if the file changed into something
        unusable)."""
        info = self.get(sae_id)
        read_info, sae = read_sae(Path(info.path))
        if read_info.id != info.id:
            raise InvalidRequest(
                f"the file of {sae_id} at {info.path} has changed since it was registered (now "
                f"{read_info.id}); register it again"
            )
        return sae

    def register(
        self,
        path: str | None,
        repo: str | None,
        repo_path: str | None,
        revision: str | None,
        published: PublishedSAE | None = None,
    ) -> tuple[SAEInfo, bool]:
        """Read and validate an SAE from a local path or a hub repo (a SAELens release's, when
        `published` says which); returns (info, newly registered)."""
        location = self._local(path) if path else self._download(repo, repo_path, revision)
        info, _ = read_sae(location)
        if published is not None:  # the registry knows what the files do not say
            info = dataclasses.replace(
                info,
                model_name=info.model_name or published.model,
                neuronpedia_id=published.neuronpedia_id or info.neuronpedia_id,
                release=published.release,
                release_sae_id=published.sae_id,
            )
        known = self.infos.get(info.id)
        if known is not None and (published is None or known.release is not None):
            return known, False
        if known is not None:  # registered by path before: it gains its release's names
            add_sae(self.store, info.to_dict())
            self.infos[info.id] = info
            return info, False
        # before it is registered: unreadable labels refuse the SAE (400 invalid_sae)
        self.book.seed(info)
        add_sae(self.store, info.to_dict())
        self.infos[info.id] = info
        return info, True

    def peek(self, location: Path) -> SAEInfo:
        """What the SAE at `location` is (its id: a hash of its weights), registered or not."""
        info, _ = read_sae(location)
        return info

    def readable(self, sae_id: str) -> bool:
        """Whether a registered SAE's file is still there with the weights it was registered
        with."""
        try:
            self.load(sae_id)
        except (MillmError, OSError, ValueError):  # changed, gone, or no longer an SAE
            return False
        return True

    def relocate(self, location: Path) -> SAEInfo | None:
        """An SAE registered before from another place and found now at `location` (the same
        weights, so the same id): its registration moves there. The moved info, or None when it
        is not registered or already read from there."""
        info, _ = read_sae(location)
        known = self.infos.get(info.id)
        if known is None or known.path == info.path:
            return None
        moved = dataclasses.replace(known, path=info.path)
        add_sae(self.store, moved.to_dict())
        self.infos[info.id] = moved
        return moved

    def forget(self, sae_id: str) -> None:
        """Remove the registration (the caller checks it is not attached). Its labels are kept,
        keyed by the id (a hash of the weights): registering the same file again finds them."""
        self.get(sae_id)
        remove_sae(self.store, sae_id)
        self.infos.pop(sae_id, None)

    def labels(self, sae_id: str) -> dict[int, dict]:
        """The SAE's feature labels (index -> {"label", <detail>, "source"}), possibly none; 404
        for an unknown SAE."""
        self.get(sae_id)
        return self.book.entries(sae_id)

    @staticmethod
    def _local(path: str) -> Path:
        location = Path(path).expanduser()
        if not location.exists():
            raise InvalidRequest(f"no file or directory at {path!r}", param="path")
        return location.resolve()

    def _download(self, repo: str | None, repo_path: str | None, revision: str | None) -> Path:
        if not repo:
            raise InvalidRequest(
                "give either path (a local SAE) or repo (+ path inside it) for a hub SAE",
                param="path",
            )
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        folder = (repo_path or "").strip("/")
        patterns = [f"{folder}/{name}" if folder else name for name in HUB_SAE_PATTERNS]
        if folder.endswith(".npz"):
            patterns = [
                folder,
                f"{folder.rsplit('/', 1)[0]}/{LABELS_FILE}" if "/" in folder else LABELS_FILE,
            ]
        # The user's own Hugging Face cache first (read, never written), then millm's; a folder
        # found there with its files loads without the network.
        for cache_dir in hub_cache_dirs(self.hub_dir):
            try:
                cached = Path(
                    snapshot_download(
                        repo,
                        revision=revision,
                        cache_dir=cache_dir,
                        local_files_only=True,
                        allow_patterns=patterns,
                    )
                )
            except (LocalEntryNotFoundError, OSError, ValueError):
                continue
            location = cached / folder if folder else cached
            if location.exists() and any(location.iterdir() if location.is_dir() else [location]):
                return location
        try:
            snapshot = Path(
                snapshot_download(
                    repo, revision=revision, cache_dir=self.hub_dir, allow_patterns=patterns
                )
            )
        except Exception as exc:  # offline, unknown repo, gated: all end here with the hub's reason
            raise InvalidRequest(
                f"could not fetch {repo}/{folder} from the Hugging Face hub ({describe(exc)})",
                param="repo",
            ) from None
        location = snapshot / folder if folder else snapshot
        if not location.exists():
            raise InvalidRequest(f"{repo} has no {folder!r}", param="path")
        return location
