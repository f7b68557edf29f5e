"""Path confinement: a path sent over HTTP is read only inside the directories the operator allowed.

Allowed: the data directory, each of MILLM_ALLOWED_PATHS, and the start-up `--model` (a
directory or a file). A path is resolved first (`~`, `..` and symlinks), so neither a `..` nor
a link inside an allowed directory leads out of it. Every check runs before the file system is
asked whether the path exists, and the refusal reads the same either way, so a client learns
nothing about files it may not read. Hub ids and paths inside a hub repository may not climb
(`..`) or be absolute either.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import TypeGuard

from millm.engine.sources import HUB_GGUF_ID, HUB_ID, PACKAGED
from millm.errors import PathNotAllowed


def resolved(path: str | Path) -> Path | None:
    """The absolute path with `~`, `..` and symlinks resolved (the file need not exist); None for
    what names no path at all (a NUL byte, an unknown `~user`, a link loop)."""
    try:
        return Path(path).expanduser().resolve()
    except (ValueError, OSError, RuntimeError):
        return None


def inside(path: Path | None, roots: tuple[Path, ...]) -> TypeGuard[Path]:
    """Whether a resolved path is one of `roots` or lies under one."""
    return path is not None and any(path == root or path.is_relative_to(root) for root in roots)


def climbs(relative: str) -> bool:
    """Whether a path inside a repository is absolute or has a `..` segment (either way it may
    leave it), or holds a NUL byte (no path at all)."""
    if (
        "\x00" in relative
        or relative.startswith(("/", "\\", "~"))
        or ":" in relative.split("/", 1)[0]
    ):
        return True
    return any(part == ".." for part in PurePosixPath(relative.replace("\\", "/")).parts)


def is_hub_id(reference: str, quantised: bool = False) -> bool:
    """A Hugging Face hub id (owner/name; with `quantised` also owner/name:QUANT, one GGUF file of
    a model repository) that names no local path (`.`/`..` segments excluded)."""
    return (
        bool(HUB_ID.match(reference) or (quantised and HUB_GGUF_ID.match(reference)))
        and not reference.startswith((".", "/", "~"))
        and not climbs(reference)
        and all(part not in (".", "..") for part in reference.split("/"))
    )


class PathPolicy:
    """The allowed roots, and the checks that keep clients' paths inside them."""

    def __init__(self, home: Path, allowed: list[Path], startup_model: Path | None = None):
        roots = [
            home,
            *allowed,
            *([startup_model] if startup_model is not None else []),
        ]  # --model: the operator's own
        self.roots = tuple(dict.fromkeys(root for root in map(resolved, roots) if root is not None))

    def refusal(self, given: str, param: str) -> PathNotAllowed:
        """The 403 for a path outside the roots (the same words whether it exists or not)."""
        return PathNotAllowed(
            f"{param} {given!r} is outside the directories this server reads for clients "
            "(the data directory and MILLM_ALLOWED_PATHS); ask the operator to allow it",
            param=param,
        )

    def local(self, given: str, param: str) -> Path:
        """A client's local path, resolved, if it lies inside the roots; else 403
        path_not_allowed."""
        path = resolved(given)
        if not inside(path, self.roots):
            raise self.refusal(given, param)
        return path

    def hub_part(self, value: str | None, param: str) -> None:
        """A hub id, revision or path inside a repository must not climb out of its folder (403)."""
        if value is not None and climbs(value):
            raise self.refusal(value, param)

    def model_reference(self, reference: str, param: str = "source") -> bool:
        """Check a model reference sent over HTTP; returns whether it may be read as a local path.

        Inside the roots it is whatever it names (a directory, a .gguf file, or a hub id if no
        such path exists); outside, only a hub id, looked up on the hub and never on disk.
        """
        if reference in PACKAGED:
            return True
        if inside(resolved(reference), self.roots):
            return True
        if is_hub_id(reference, quantised=True):
            return False
        raise self.refusal(reference, param)
