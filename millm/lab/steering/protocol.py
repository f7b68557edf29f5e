"""The management API's bodies: SAE registration and attachment, live feature settings, and
profiles. Strict: an unknown field is refused here, where nothing needs to be reported."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

from millm.engine.sources import HUB_ID
from millm.formats.document_schemas import (
    MAX_DESCRIPTION,
    AbortEntries,
    SteeringEntries,
    VectorEntries,
)
from millm.formats.document_schemas import NAME_PATTERN as PROFILE_NAME_PATTERN
from millm.interp.steering import OPS, STRENGTH_LIMIT, FeatureOp, Op, feature_op
from millm.v1.policy.body_fields import StrictBody
from millm.v1.policy.schema_rules import absent_or_null, any_of, sent

# `--sae`'s forms (kernel/model/sae_specs.py reads them): a path (/, . or ~ first), a release and
# id, or a hub repository with an optional folder and revision. A relative path reads as the last.
SAE_SPEC_PATTERN = r"^([/.~].*|[^/:@\s]+:\S.*|[A-Za-z0-9][\w.-]*/[\w.-]+(:[^@]*)?(@\S+)?)$"

HUB_ID_PATTERN = HUB_ID.pattern  # a hub repository's id, as the request schemas state it


# The limits below are stated in the schema only: check_strength, feature_op and validate_profile
# enforce them, with messages that name the limit (a pydantic bound would answer first, in its own
# words).
STRENGTH_RANGE = {"minimum": -STRENGTH_LIMIT, "maximum": STRENGTH_LIMIT}
VALUE_RANGE = {"minimum": 0}
NUMBER = {"type": "number"}
NULL = {"type": "null"}
# Which fields each op takes (feature_op checks the same): add a strength, clamp and cap a value,
# ablate neither.
OP_RULES: dict[str, Any] = {
    "allOf": [
        {
            "if": {"properties": {"op": {"const": "add"}}},
            "then": {"required": ["strength"], "properties": {"strength": NUMBER, "value": NULL}},
        },
        {
            "if": {"required": ["op"], "properties": {"op": {"enum": ["clamp", "cap"]}}},
            "then": {"required": ["value"], "properties": {"value": NUMBER, "strength": NULL}},
        },
        {
            "if": {"required": ["op"], "properties": {"op": {"const": "ablate"}}},
            "then": {"properties": {"strength": NULL, "value": NULL}},
        },
    ]
}


class RegisterSAE(StrictBody):
    """A local SAE (`path`), one on the Hugging Face hub (`repo`, `path` inside it, `revision`), or
    a published one by its SAELens names (`release` and `sae_id`)."""

    # Exactly one way: a local path, a hub repo (and the path inside it, which may be empty), a
    # release and its id, or all of it in one string (`sae`).
    model_config = ConfigDict(
        json_schema_extra=any_of(
            {
                "allOf": [
                    {
                        "required": ["path"],
                        "properties": {"path": {"type": "string", "minLength": 1}},
                    },
                    *map(absent_or_null, ("release", "sae_id", "sae")),
                ]
            },
            {"allOf": [sent("repo"), *map(absent_or_null, ("release", "sae_id", "sae"))]},
            {
                "allOf": [
                    sent("release"),
                    sent("sae_id"),
                    *map(absent_or_null, ("path", "repo", "sae")),
                ]
            },
            {
                "allOf": [
                    sent("sae"),
                    *map(absent_or_null, ("path", "repo", "release", "sae_id", "revision")),
                ]
            },
        )
    )
    path: str | None = Field(
        None,
        description="A local SAE (inside the data directory or MILLM_ALLOWED_PATHS), or the path "
        "inside `repo`.",
    )
    repo: Annotated[str, Field(pattern=HUB_ID_PATTERN)] | None = Field(
        None, description="A Hugging Face hub repository, owner/name."
    )
    revision: str | None = None
    release: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="A SAELens release (gemma-scope-2b-pt-res-canonical); with `sae_id`, resolved "
        "through SAELens's registry to its hub repository and folder.",
    )
    sae_id: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description="The SAE's id in `release` (layer_12/width_16k/canonical), as SAELens names "
        "it.",
    )

    sae: (
        Annotated[str, Field(min_length=1, json_schema_extra={"pattern": SAE_SPEC_PATTERN})] | None
    ) = Field(
        None,
        description="All of it in one string, as `--sae` takes it: a local path, RELEASE:SAE_ID or "
        "OWNER/NAME[:PATH][@REVISION].",
    )

    @model_validator(mode="after")
    def _one_source(self):
        # Each way names the SAE whole: a second one beside it would be ignored.
        given = [self.sae is not None, self.release is not None, self.path or self.repo]
        if sum(map(bool, given)) > 1:
            raise ValueError("give one of sae, release + sae_id, or path / repo")
        if self.sae is not None and self.revision is not None:
            raise ValueError("sae names its revision itself (OWNER/NAME:PATH@REVISION)")
        if (self.release is None) != (self.sae_id is None):
            raise ValueError("release and sae_id go together")
        return self


class LabelSource(StrictBody):
    """Where labels are imported from: `neuronpedia` (the SAE's Neuronpedia export), a URL, or a
    file inside the allowed directories (a Neuronpedia export, JSON Lines or gzipped, or any
    format a labels PUT accepts)."""

    source: Annotated[str, Field(min_length=1)]
    replace: bool = Field(True, description="Replace the SAE's labels (true) or merge into them.")


class AttachSAE(StrictBody):
    """Attach at the SAE's own hook layer, or at `layer`."""

    layer: Annotated[int, Field(ge=0)] | None = None


class FeatureSetting(StrictBody):
    """One feature's op: add `strength` (within ±200; 0 clears it, the default op), clamp at `value`
    (its activation, >= 0), ablate, or cap at `value` (the residual's component along its decoder
    row)."""

    model_config = ConfigDict(json_schema_extra=OP_RULES)
    op: Op = Field("add", description=f"One of {', '.join(OPS)}.")
    strength: Annotated[float, Field(json_schema_extra=STRENGTH_RANGE)] | None = None
    value: Annotated[float, Field(json_schema_extra=VALUE_RANGE)] | None = None

    def checked(self, prefix: str = "") -> FeatureOp:
        """The FeatureOp it says, or a 400 naming the field."""
        return feature_op(self.op, self.strength, self.value, prefix)


class FeatureStrength(FeatureSetting):
    """A feature of an SAE and its op."""

    model_config = ConfigDict(json_schema_extra=OP_RULES)
    sae_id: str
    index: Annotated[int, Field(ge=0)]


class ManyStrengths(StrictBody):
    """Set many features in one change; `replace` clears every other live value first."""

    features: list[FeatureStrength]
    replace: bool = False


ProfileName = Annotated[
    str,
    Field(
        json_schema_extra={"pattern": PROFILE_NAME_PATTERN},
        description="1-120 letters, digits, space, '.', '_', '-'.",
    ),
]
Description = Annotated[str, Field(json_schema_extra={"maxLength": MAX_DESCRIPTION})]


class ProfileCreate(StrictBody):
    """A new profile: its name, description and what it steers (the entries of a profile
    document, version 2)."""

    name: ProfileName
    description: Description | None = None
    steering: SteeringEntries | None = None
    vectors: VectorEntries | None = None
    abort: AbortEntries | None = None


class ProfileUpdate(StrictBody):
    """The fields given replace the stored ones (null keeps them); the result is validated whole."""

    name: ProfileName | None = None
    description: Description | None = None
    steering: SteeringEntries | None = None
    vectors: VectorEntries | None = None
    abort: AbortEntries | None = None
    revision: int | None = Field(
        None,
        ge=1,
        description="The profile's revision as you read it: the update is refused (409 "
        "revision_conflict) if anyone, through any replica, changed the profile since. Without "
        "it, the fields given land on the profile as stored when the update commits.",
    )


class SaveCurrent(StrictBody):
    """Save the live steering values as a new profile."""

    name: ProfileName
    description: Description = ""
