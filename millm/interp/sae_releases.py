"""Published SAEs by name: SAELens's registry maps a release and an SAE id (say
`gemma-scope-2b-pt-res-canonical` and `layer_12/width_16k/canonical`) to a hub repository, the
folder in it, the model it was trained on and its Neuronpedia id.

The registry is the `pretrained_saes.yaml` the sae-lens package ships (`pip install
'millm[saes]'`). It is read as a data file: importing sae_lens would import TransformerLens,
seconds of start-up, for a table lookup. Which of SAELens's conversions millm reads as files is
one table (READ); the others are refused with what to do instead.
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from millm.errors import InvalidRequest, SAEFormatError

REGISTRY_FILE = "pretrained_saes.yaml"
# SAELens's conversion function -> the layout millm reads for it (None: SAELens's own format).
READ = {
    None: "SAELens",
    "sae_lens": "SAELens",
    "gemma_2": "Gemma Scope",
    "gemma_3": "Gemma Scope 2",
    "llama_scope": "Llama Scope",
    "sparsify": "sparsify",
}
CONVERT = (
    "convert it once with SAELens (`SAE.from_pretrained(release, sae_id).save_model(folder)`) "
    "and register the folder"
)


@dataclass(frozen=True)
class PublishedSAE:
    """One SAE of a SAELens release: where it lives and what it was trained on."""

    release: str
    sae_id: str
    repo: str
    path: str
    model: str
    conversion: str | None
    neuronpedia_id: str | None

    @property
    def layout(self) -> str:
        """The file layout millm reads for it (READ's name)."""
        return READ[self.conversion]


def registry_file() -> Path:
    """The registry inside the installed sae-lens package, found without importing it."""
    spec = importlib.util.find_spec("sae_lens")
    if spec is None or not spec.submodule_search_locations:
        raise InvalidRequest(
            "SAELens release names are resolved through the sae-lens package's registry, which is "
            "not installed: pip install 'millm[saes]' (or give the SAE's path or hub repo)",
            param="release",
            code="sae_registry_missing",
        )
    return Path(next(iter(spec.submodule_search_locations))) / REGISTRY_FILE


@cache
def _registry(path: Path) -> dict[str, Any]:
    import yaml

    with path.open() as handle:  # 1.5 MB: the C loader takes a fraction of the pure one's time
        return yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def registry() -> dict[str, Any]:
    """SAELens's releases: name -> {repo_id, model, conversion_func, saes: [{id, path, ...}]}."""
    return _registry(registry_file())


def is_release(name: str) -> bool:
    """Whether `name` is a SAELens release (False when sae-lens is not installed)."""
    if importlib.util.find_spec("sae_lens") is None:
        return False
    return name in registry()


def _unknown(kind: str, name: str, known: list[str], param: str, code: str) -> InvalidRequest:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return InvalidRequest(
        f"{kind} {name!r} is not in SAELens's registry{hint}", param=param, code=code
    )


def find(release: str, sae_id: str) -> PublishedSAE:
    """The SAE `sae_id` of `release`, or a 400 naming the nearest names; one whose files millm
    does not read is refused here, before anything is downloaded."""
    releases = registry()
    entry = releases.get(release)
    if entry is None:
        raise _unknown("release", release, list(releases), "release", "unknown_sae_release")
    saes = {str(sae["id"]): sae for sae in entry.get("saes", [])}
    sae = saes.get(sae_id)
    if sae is None:
        error = _unknown(f"SAE id in {release}", sae_id, list(saes), "sae_id", "unknown_sae_id")
        error.message += f" ({len(saes)} ids; GET /api/saes/releases/{release} lists them)"
        raise error
    conversion = entry.get("conversion_func")
    if conversion not in READ:
        raise SAEFormatError(
            f"{release} is stored in a layout millm does not read (SAELens converts it with its "
            f"{conversion!r} loader); {CONVERT}"
        )
    return PublishedSAE(
        release=release,
        sae_id=sae_id,
        repo=str(entry["repo_id"]),
        path=str(sae["path"]),
        model=str(entry["model"]),
        conversion=conversion,
        neuronpedia_id=sae.get("neuronpedia"),
    )


def releases_view(model: str | None = None) -> list[dict]:
    """Every release (for models whose name contains `model`, case-insensitive), summarised."""
    wanted = (model or "").lower()
    return [
        {
            "release": name,
            "repo": entry["repo_id"],
            "model": entry["model"],
            "layout": READ.get(entry.get("conversion_func")),
            "readable": entry.get("conversion_func") in READ,
            "saes": len(entry.get("saes", [])),
        }
        for name, entry in registry().items()
        if wanted in str(entry.get("model", "")).lower()
    ]


def release_view(release: str) -> dict:
    """A release's SAEs as the API lists them (id, path, Neuronpedia id, L0 where SAELens has
    it)."""
    entry = registry().get(release)
    if entry is None:
        raise _unknown("release", release, list(registry()), "release", "unknown_sae_release")
    conversion = entry.get("conversion_func")
    return {
        "release": release,
        "repo": entry["repo_id"],
        "model": entry["model"],
        "layout": READ.get(conversion),
        "readable": conversion in READ,
        "saes": [
            {
                "sae_id": str(sae["id"]),
                "path": str(sae["path"]),
                "neuronpedia_id": sae.get("neuronpedia"),
                "l0": sae.get("l0"),
            }
            for sae in entry.get("saes", [])
        ],
    }
