"""A Hugging Face cache laid out as huggingface_hub writes it
(models--owner--name/snapshots/<commit>, refs/main), so code that resolves hub ids loads from it
with HF_HUB_OFFLINE=1 and no network."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cached_repo(cache: Path, repo_id: str) -> Path:
    """The snapshot folder of `repo_id` in `cache` (made, with refs/main pointing at it)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def put(cache: Path, repo_id: str, path_in_repo: str, source: Path) -> Path:
    """Copy `source` (a file or a folder) to `path_in_repo` in the cached repo; the copy's path."""
    target = cached_repo(cache, repo_id) / path_in_repo
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)
    return target
