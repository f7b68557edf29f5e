"""Profile documents: the versioned JSON a profile is stored, exported and imported as.

    {"kind": "millm.profile", "version": 1, "name": "...", "description": "...",
     "steering": [{"sae_id": "sae_...", "layer": 15, "features": [{"index": 12, "strength": 8.0}]}]}

A bundle is {"kind": "millm.profile-bundle", "version": 1, "profiles": [<document>, ...]}.
Validation is pure and whole: a document is accepted entirely or refused with every problem's
location, so an import never stores half of anything.
"""

from __future__ import annotations

import math
import re

from millm.errors import InvalidProfile
from millm.interp.steering import STRENGTH_LIMIT

PROFILE_KIND = "millm.profile"
BUNDLE_KIND = "millm.profile-bundle"
VERSION = 1
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._\-]{0,119}$")
MAX_DESCRIPTION = 2000
MAX_BUNDLE = 500


def _problems(doc, where: str) -> list[str]:
    problems = []
    if not isinstance(doc, dict):
        return [f"{where or 'document'}: must be an object"]
    prefix = f"{where}." if where else ""
    if doc.get("kind", PROFILE_KIND) != PROFILE_KIND:
        problems.append(f"{prefix}kind: must be {PROFILE_KIND!r}")
    if doc.get("version", VERSION) != VERSION:
        problems.append(f"{prefix}version: {doc.get('version')!r} is not a supported version ({VERSION})")
    name = doc.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        problems.append(f"{prefix}name: 1-120 characters of letters, digits, space, '.', '_' or '-', starting with a letter or digit")
    description = doc.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        problems.append(f"{prefix}description: a string of at most {MAX_DESCRIPTION} characters")
    steering = doc.get("steering", [])
    if not isinstance(steering, list):
        return problems + [f"{prefix}steering: must be a list"]
    seen_saes = set()
    for i, entry in enumerate(steering):
        at = f"{prefix}steering[{i}]"
        if not isinstance(entry, dict):
            problems.append(f"{at}: must be an object")
            continue
        sae_id = entry.get("sae_id")
        if not isinstance(sae_id, str) or not sae_id:
            problems.append(f"{at}.sae_id: required string")
        elif sae_id in seen_saes:
            problems.append(f"{at}.sae_id: {sae_id} appears twice; give one entry per SAE")
        else:
            seen_saes.add(sae_id)
        layer = entry.get("layer")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or layer < 0):
            problems.append(f"{at}.layer: a non-negative integer")
        features = entry.get("features")
        if not isinstance(features, list):
            problems.append(f"{at}.features: must be a list")
            continue
        seen = set()
        for j, feature in enumerate(features):
            fat = f"{at}.features[{j}]"
            if not isinstance(feature, dict):
                problems.append(f"{fat}: must be an object")
                continue
            index, strength = feature.get("index"), feature.get("strength")
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                problems.append(f"{fat}.index: a non-negative integer")
            elif index in seen:
                problems.append(f"{fat}.index: feature {index} appears twice")
            else:
                seen.add(index)
            if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
                problems.append(f"{fat}.strength: a finite number")
            elif abs(strength) > STRENGTH_LIMIT:
                problems.append(f"{fat}.strength: {strength} is outside ±{STRENGTH_LIMIT:g}")
    return problems


def normalise(doc: dict) -> dict:
    """The canonical form of a valid document (kind and version filled, floats for strengths)."""
    return {
        "kind": PROFILE_KIND,
        "version": VERSION,
        "name": doc["name"],
        "description": doc.get("description", ""),
        "steering": [
            {
                "sae_id": entry["sae_id"],
                **({"layer": entry["layer"]} if entry.get("layer") is not None else {}),
                "features": [{"index": f["index"], "strength": float(f["strength"])} for f in entry["features"]],
            }
            for entry in doc.get("steering", [])
        ],
    }


def validate_profile(doc) -> dict:
    """A valid document in canonical form, or InvalidProfile listing every problem."""
    problems = _problems(doc, "")
    if problems:
        raise InvalidProfile("invalid profile: " + "; ".join(problems))
    return normalise(doc)


def validate_import(payload) -> list[dict]:
    """One document or a bundle -> the canonical documents; any problem refuses the whole payload."""
    if isinstance(payload, dict) and payload.get("kind") == BUNDLE_KIND:
        if payload.get("version", VERSION) != VERSION:
            raise InvalidProfile(f"invalid bundle: version {payload.get('version')!r} is not supported ({VERSION})")
        docs = payload.get("profiles")
        if not isinstance(docs, list) or not 1 <= len(docs) <= MAX_BUNDLE:
            raise InvalidProfile(f"invalid bundle: profiles must be a list of 1 to {MAX_BUNDLE} documents")
        problems = [p for i, doc in enumerate(docs) for p in _problems(doc, f"profiles[{i}]")]
        names = [doc.get("name") for doc in docs if isinstance(doc, dict)]
        duplicates = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
        if duplicates:
            problems.append(f"profiles: names appear twice: {duplicates}")
        if problems:
            raise InvalidProfile("invalid bundle: " + "; ".join(problems))
        return [normalise(doc) for doc in docs]
    return [validate_profile(payload)]


def profile_strengths(doc: dict) -> dict[str, dict[int, float]]:
    """sae_id -> {feature: strength} of a (valid) document."""
    return {entry["sae_id"]: {f["index"]: f["strength"] for f in entry["features"]} for entry in doc["steering"]}


def bundle(docs: list[dict]) -> dict:
    """A bundle document holding these profiles."""
    return {"kind": BUNDLE_KIND, "version": VERSION, "profiles": docs}
