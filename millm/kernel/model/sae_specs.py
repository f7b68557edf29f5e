"""How `--sae` (and MILLM_SAES) names an SAE: one string, read in this order.

- a local path (one that starts with /, . or ~, or one that exists): an SAE's folder, a params.npz;
- RELEASE:SAE_ID, a SAELens release and an SAE id in it
  (`gemma-scope-2b-pt-res-canonical:layer_12/width_16k/canonical`): a release name has no slash;
- OWNER/NAME[:PATH][@REVISION], a hub repository and the SAE's folder inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from millm.errors import InvalidRequest
from millm.kernel.model.paths import is_hub_id

GRAMMAR = (
    "a local path, RELEASE:SAE_ID (a SAELens release) or OWNER/NAME[:PATH][@REVISION] (a "
    "hub repository)"
)


@dataclass(frozen=True)
class SAESpec:
    """Where one start-up SAE comes from (exactly one of path, repo, release is set)."""

    text: str
    path: str | None = None
    repo: str | None = None
    repo_path: str | None = None
    revision: str | None = None
    release: str | None = None
    sae_id: str | None = None


def parse_sae_spec(text: str) -> SAESpec:
    """The SAE `text` names, or a 400 saying the grammar."""
    spec = text.strip()
    if not spec:
        raise InvalidRequest(f"an empty SAE name: give {GRAMMAR}", param="sae")
    if spec.startswith(("/", ".", "~")) or Path(spec).expanduser().exists():
        return SAESpec(spec, path=spec)
    head, colon, tail = spec.partition(":")
    if colon and "/" not in head and head and tail:
        return SAESpec(spec, release=head, sae_id=tail)
    body, _, revision = spec.rpartition("@") if "@" in spec else (spec, "", "")
    head, _, repo_path = body.partition(":")
    if is_hub_id(head):
        return SAESpec(spec, repo=head, repo_path=repo_path or None, revision=revision or None)
    raise InvalidRequest(f"SAE {spec!r}: no file or folder there, and not {GRAMMAR}", param="sae")
