"""The MCP tools' path and query parameters (mcp_tools.py): each tool's twin of its route's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Params(BaseModel):
    """A tool's path and query parameters; strict, as JSON arguments are typed already."""

    model_config = ConfigDict(strict=True, extra="forbid")


SaeId = Annotated[str, Field(description="An SAE's id (list_saes).")]
Index = Annotated[int, Field(description="A feature's index in the SAE.")]


class NoParams(Params):
    """A tool of a route without parameters."""


class Sae(Params):
    """The SAE a route names in its path."""

    sae_id: SaeId


class TranscoderSetKey(Params):
    """The transcoder set a route names in its path."""

    set_id: Annotated[str, Field(description="A registered transcoder set's id (tc_…).")]


class Feature(Params):
    """A feature of an SAE, as /api/steering/saes/{sae_id}/features/{index} names it."""

    sae_id: SaeId
    index: Index


# The bounds below are labels.py's Query() bounds, which the route's schema states.
class Search(Params):
    """GET /api/saes/{sae_id}/features."""

    sae_id: SaeId
    q: Annotated[str, Field(max_length=1000)] = ""
    limit: Annotated[int, Field(ge=1, le=1000)] = 50
    by: Literal["text", "meaning", "both"] = "text"


class FeatureLookup(Params):
    """GET /api/saes/{sae_id}/features/{index}."""

    sae_id: SaeId
    index: Index
    k: Annotated[int, Field(ge=1, le=100)] = 10


class ClearAll(Params):
    """DELETE /api/steering/features."""

    sae_id: Annotated[
        str | None, Field(description="Clear only this SAE's features (default: every SAE's).")
    ] = None


class VariantKey(Params):
    """A steered variant, by name or id."""

    key: Annotated[str, Field(description="The variant's name or id (list_variants).")]


class Job(Params):
    """A job, by id."""

    job_id: Annotated[
        str, Field(description="The job's id (as a tool that starts one returns it).")
    ]


class TrainingKey(Params):
    """A dictionary training, by id."""

    training_id: Annotated[
        str, Field(description="The training's id (as train_dictionary returns it).")
    ]


class GraphKey(Params):
    """An attribution graph, by id."""

    graph_id: Annotated[
        str,
        Field(
            description="The graph's id (attribution_graph's id, or an attribution job's graph_id)."
        ),
    ]


class Profile(Params):
    """A profile, by name or id."""

    key: Annotated[str, Field(description="The profile's name or id (list_profiles).")]


class BatchKey(Params):
    """A batch, by id."""

    batch_id: Annotated[
        str, Field(description="The batch's id (batch_..., as POST /v1/batches returned it).")
    ]


class BatchPage(Params):
    """A page of batches, newest first."""

    limit: Annotated[int, Field(ge=1, le=100, description="Batches on the page (1-100).")] = 20
    after: Annotated[
        str | None, Field(description="The batch the page starts after (the last one seen).")
    ] = None


class ClusterKey(Params):
    """A cluster, by name or id."""

    cluster_id: Annotated[str, Field(description="The cluster's name or id (GET /api/clusters).")]


class CircuitKey(Params):
    """A circuit, by name or id."""

    circuit_id: Annotated[str, Field(description="The circuit's name or id (GET /api/circuits).")]


Since = Annotated[float | None, Field(description="Only events after this Unix time.")]
EventLimit = Annotated[int, Field(ge=1, le=500, description="Events (1-500).")]


class ClusterEvents(Params):
    """A cluster's sensing events, newest first (all clusters' when none is named)."""

    cluster_id: Annotated[str | None, Field(description="The cluster's name or id.")] = None
    profile_id: Annotated[
        str | None, Field(description="The same, as the original miLLM names it.")
    ] = None
    limit: EventLimit = 50
    since: Since = None


class CircuitEvents(Params):
    """A circuit's edge events, newest first (all circuits' when none is named)."""

    circuit_id: Annotated[str | None, Field(description="The circuit's name or id.")] = None
    edge_key: Annotated[
        str | None, Field(description="One edge, {up}@{layer}->{down}@{layer}.")
    ] = None
    limit: EventLimit = 50
    since: Since = None
