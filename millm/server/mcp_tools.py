"""The MCP tools: each the twin of a route, with that route's parameters and body, and a call
of the same facade method on the thread the route would use. Over 400 lines because it is the
tools' table (TOOLS), each row beside the small call it makes, read down together."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from anyio import to_thread
from pydantic import BaseModel

from millm.lab.attribution.protocol import AttributionRequest
from millm.lab.compare.protocol import CompareRequest
from millm.lab.dictionaries.protocol import GradeRequest, TrainRequest
from millm.lab.discovery.lens_protocol import LensRequest
from millm.lab.discovery.protocol import ContrastRequest, InspectRequest
from millm.lab.labels.protocol import ExplainRequest, TopTokenLabels
from millm.lab.steering.protocol import FeatureSetting
from millm.lab.variants.protocol import VariantBody
from millm.server.facades import Facades
from millm.server.mcp_params import (
    BatchKey,
    BatchPage,
    CircuitEvents,
    CircuitKey,
    ClearAll,
    ClusterEvents,
    ClusterKey,
    Feature,
    FeatureLookup,
    GraphKey,
    Job,
    NoParams,
    Params,
    Profile,
    Sae,
    Search,
    TrainingKey,
    TranscoderSetKey,
    VariantKey,
)
from millm.v1.serving.http_replies import report_headers

# A tool's work: (the facades, its parameters, its body or None) -> what the route answers, or a
# Result.
Call = Callable[[Facades, Any, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Result:
    """An answer with what its route sends as X-miLLM-* headers (they go to the result's _meta)."""

    body: Any
    headers: dict[str, str]


@dataclass(frozen=True)
class McpTool:
    """One tool: its name and description, the route it is the twin of, and its call."""

    name: str
    description: str
    method: str
    path: str
    call: Call
    params: type[Params] = NoParams
    body: type[BaseModel] | None = None
    read_only: bool = False
    omit: frozenset[str] = frozenset()  # body fields a tool cannot honour (a stream)


def blocking(function: Callable[..., Any], *args: Any) -> Awaitable[Any]:
    """`function(*args)` on a worker thread, as FastAPI runs the plain-function routes that call
    it."""
    return to_thread.run_sync(partial(function, *args))


async def _list_saes(f: Facades, _: NoParams, __: None) -> dict:
    return {"object": "list", "data": await blocking(f.steering.list_saes)}


async def _search(f: Facades, p: Search, _: None) -> Any:
    return await blocking(f.features.search_features, p.sae_id, p.q, p.limit, p.by)


async def _feature(f: Facades, p: FeatureLookup, _: None) -> Any:
    return await f.features.feature_detail(p.sae_id, p.index, p.k)


async def _inspect(f: Facades, p: Sae, body: InspectRequest) -> Any:
    return await f.discovery.inspect(p.sae_id, body)


async def _contrast(f: Facades, p: Sae, body: ContrastRequest) -> Any:
    return await f.discovery.contrast(p.sae_id, body)


async def _steering(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.steering.steering_view)


async def _set_feature(f: Facades, p: Feature, body: FeatureSetting) -> dict:
    return await blocking(lambda: f.steering.set_features({(p.sae_id, p.index): body.checked()}))


async def _clear_feature(f: Facades, p: Feature, _: None) -> dict:
    return await blocking(f.steering.set_features, {(p.sae_id, p.index): None})


async def _clear_steering(f: Facades, p: ClearAll, _: None) -> dict:
    return await blocking(f.steering.set_features, {}, p.sae_id if p.sae_id is not None else True)


async def _profiles(f: Facades, _: NoParams, __: None) -> dict:
    return {"object": "list", "data": await blocking(f.steering.list_profiles)}


async def _activate(f: Facades, p: Profile, _: None) -> dict:
    return await blocking(f.steering.activate_profile, p.key)


async def _deactivate(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.steering.deactivate_profile)


async def _compare(f: Facades, _: NoParams, body: CompareRequest) -> Result:
    # No X-miLLM-Strict header here: fields the comparison ignores are reported, in _meta, as over
    # HTTP.
    reply = await f.comparison.compare(body, strict=False)
    assert reply.body is not None  # stream is not an argument of this tool
    return Result(
        reply.body.model_dump(),
        report_headers(reply.report, f.settings.ignored_fields_header_max_bytes),
    )


async def _lens(f: Facades, _: NoParams, body: LensRequest) -> Any:
    return await f.discovery.lens(body)


async def _attribution(f: Facades, _: NoParams, body: AttributionRequest) -> Any:
    return await f.attribution.attribute(body)


async def _attribution_job(f: Facades, _: NoParams, body: AttributionRequest) -> dict:
    return (await f.attribution.start_job(body)).model_dump(mode="json")


async def _graph(f: Facades, p: GraphKey, _: None) -> Any:
    return f.attribution.graph(p.graph_id)  # the last graphs, in memory


async def _variants(f: Facades, _: NoParams, __: None) -> dict:
    return (await blocking(f.variants.list)).model_dump()


async def _create_variant(f: Facades, _: NoParams, body: VariantBody) -> dict:
    return (await blocking(f.variants.create, body)).model_dump()


async def _delete_variant(f: Facades, p: VariantKey, _: None) -> dict:
    return (await blocking(f.variants.delete, p.key)).model_dump()


async def _monitoring_stats(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.monitor.statistics)


async def _explain(f: Facades, p: Sae, body: ExplainRequest) -> dict:
    return (await blocking(f.labelling.explain, p.sae_id, body)).model_dump(mode="json")


async def _label_top_tokens(f: Facades, p: Sae, body: TopTokenLabels) -> dict:
    return (await blocking(f.labelling.label_top_tokens, p.sae_id, body)).model_dump(mode="json")


async def _job(f: Facades, p: Job, _: None) -> dict:
    return f.jobs.get(p.job_id).model_dump(mode="json")


async def _train(f: Facades, _: NoParams, body: TrainRequest) -> dict:
    return (await blocking(f.dictionaries.train, body)).model_dump(mode="json")


async def _training(f: Facades, p: TrainingKey, _: None) -> dict:
    return (await blocking(f.dictionaries.view, p.training_id)).model_dump(mode="json")


async def _grade(f: Facades, p: Sae, body: GradeRequest) -> dict:
    return (await blocking(f.dictionaries.grade, p.sae_id, body)).model_dump(mode="json")


async def _grades(f: Facades, p: Sae, _: None) -> dict:
    return {"object": "list", "data": await blocking(f.dictionaries.grades, p.sae_id)}


async def _grade_set(f: Facades, p: TranscoderSetKey, body: GradeRequest) -> dict:
    return (await blocking(f.dictionaries.grade_set, p.set_id, body)).model_dump(mode="json")


async def _set_grades(f: Facades, p: TranscoderSetKey, _: None) -> dict:
    return {"object": "list", "data": await blocking(f.dictionaries.set_grades, p.set_id)}


async def _circuit_claims(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.circuit_serving.claims)


async def _sensing_status(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.sensing.status, "cluster")


async def _circuit_sensing_status(f: Facades, _: NoParams, __: None) -> dict:
    return await blocking(f.sensing.status, "circuit")


async def _sensing_events(f: Facades, p: ClusterEvents, _: None) -> dict:
    cluster = p.cluster_id or p.profile_id
    return await blocking(f.sensing.events, "cluster", cluster, p.limit, p.since)


async def _circuit_sensing_events(f: Facades, p: CircuitEvents, _: None) -> dict:
    return await blocking(f.sensing.events, "circuit", p.circuit_id, p.limit, p.since, p.edge_key)


async def _enable_sensing(f: Facades, p: ClusterKey, _: None) -> dict:
    return await blocking(f.sensing.switch, "cluster", p.cluster_id, True)


async def _enable_circuit_sensing(f: Facades, p: CircuitKey, _: None) -> dict:
    return await blocking(f.sensing.switch, "circuit", p.circuit_id, True)


async def _batches(f: Facades, p: BatchPage, _: None) -> dict:
    return (await blocking(f.batches.listed, p.after, p.limit)).model_dump()


async def _batch(f: Facades, p: BatchKey, _: None) -> dict:
    return (await blocking(f.batches.get, p.batch_id)).model_dump()


TOOLS = (
    McpTool(
        "list_saes",
        "Every registered SAE: id, model, layer, width, and where it is attached.",
        "get",
        "/api/saes",
        _list_saes,
        read_only=True,
    ),
    McpTool(
        "search_features",
        "An SAE's labelled features ranked by how well their label, top tokens and example match "
        "q (BM25; empty q lists all).",
        "get",
        "/api/saes/{sae_id}/features",
        _search,
        Search,
        read_only=True,
    ),
    McpTool(
        "get_feature",
        "One feature: its label, decoder norm, calibration figures and the k features nearest by "
        "decoder cosine.",
        "get",
        "/api/saes/{sae_id}/features/{index}",
        _feature,
        FeatureLookup,
        read_only=True,
    ),
    McpTool(
        "inspect_text",
        "The SAE features that fire on a text or conversation (top_k by max, mean or count), and "
        "one feature per token.",
        "post",
        "/api/saes/{sae_id}/inspect",
        _inspect,
        Sae,
        InspectRequest,
        read_only=True,
    ),
    McpTool(
        "contrast_texts",
        "The SAE features that best separate set a from set b of texts: each set's mean, the "
        "difference and Cohen's d.",
        "post",
        "/api/saes/{sae_id}/contrast",
        _contrast,
        Sae,
        ContrastRequest,
        read_only=True,
    ),
    McpTool(
        "get_steering",
        "The live steering state: enabled, version, active profile, and every SAE's features with "
        "their op and strength.",
        "get",
        "/api/steering",
        _steering,
        read_only=True,
    ),
    McpTool(
        "set_feature",
        "Steer every request from now on: add strength × the feature's decoder row (within ±200; "
        "0 clears), or clamp, cap or ablate it.",
        "put",
        "/api/steering/saes/{sae_id}/features/{index}",
        _set_feature,
        Feature,
        FeatureSetting,
    ),
    McpTool(
        "clear_feature",
        "Stop steering one feature (remove its live value).",
        "delete",
        "/api/steering/saes/{sae_id}/features/{index}",
        _clear_feature,
        Feature,
    ),
    McpTool(
        "clear_steering",
        "Remove every live feature value, or only those of sae_id.",
        "delete",
        "/api/steering/features",
        _clear_steering,
        ClearAll,
    ),
    McpTool(
        "list_profiles",
        "Every saved steering profile, and which one is active.",
        "get",
        "/api/profiles",
        _profiles,
        read_only=True,
    ),
    McpTool(
        "activate_profile",
        "Make a saved profile the steering of every request from now on (checked against the "
        "attached SAEs first).",
        "post",
        "/api/profiles/{key}/activate",
        _activate,
        Profile,
    ),
    McpTool(
        "deactivate_profile",
        "Deactivate the active profile: the live feature values steer again.",
        "post",
        "/api/profiles/deactivate",
        _deactivate,
    ),
    McpTool(
        "compare",
        "Generate one conversation under several steerings side by side (default: unsteered and "
        "live), same prompt and seed.",
        "post",
        "/api/compare",
        _compare,
        body=CompareRequest,
        read_only=True,
        omit=frozenset({"stream"}),
    ),
    McpTool(
        "logit_lens",
        "What each block's residual stream predicts at each position of a text (the model's final "
        "norm and head applied), beside the model's own prediction; optionally steered.",
        "post",
        "/api/lens",
        _lens,
        body=LensRequest,
        read_only=True,
    ),
    McpTool(
        "attribution_graph",
        "Which features of the attached SAEs drove the model's next-token logit on a text (an "
        "attribution graph: nodes, direct-effect edges, pruned by influence), with its top "
        "features ablated on the served model to check it.",
        "post",
        "/api/attribution",
        _attribution,
        body=AttributionRequest,
        read_only=True,
    ),
    McpTool(
        "start_attribution_job",
        "The same attribution graph as a job, for long texts and large budgets: get_job follows "
        "it (its progress is the features expanded) and its result names the graph for "
        "get_attribution_graph.",
        "post",
        "/api/attribution/jobs",
        _attribution_job,
        body=AttributionRequest,
    ),
    McpTool(
        "get_attribution_graph",
        "A recent attribution graph by id (the server keeps the last 16, in memory).",
        "get",
        "/api/attribution/{graph_id}",
        _graph,
        GraphKey,
        read_only=True,
    ),
    McpTool(
        "list_variants",
        "Every steered variant (a name any /v1 client can use as a model: a base model and its "
        "steering), and whether it fits now.",
        "get",
        "/api/variants",
        _variants,
        read_only=True,
    ),
    McpTool(
        "create_variant",
        "Name a base model under a steering (a saved profile or a request's own steering, an "
        "intensity): every /v1 client can then pick it as a model.",
        "post",
        "/api/variants",
        _create_variant,
        body=VariantBody,
    ),
    McpTool(
        "delete_variant",
        "Forget a steered variant: requests naming it are refused from now on.",
        "delete",
        "/api/variants/{key}",
        _delete_variant,
        VariantKey,
    ),
    McpTool(
        "label_top_tokens",
        "Label each feature that fired in an SAE's calibration by the tokens it fired hardest on "
        "(three, e.g. 'pirate / ship / sea'), with its top tokens and best example beside the "
        "label; only features without a label unless overwrite is true. Instant: no model writes.",
        "post",
        "/api/saes/{sae_id}/labels/top-tokens",
        _label_top_tokens,
        Sae,
        TopTokenLabels,
    ),
    McpTool(
        "explain_features",
        "Have a model (the served one, another registered model loaded beside it, or the "
        "configured endpoint) explain an attached, calibrated SAE's features from their top "
        "activating windows (EleutherAI delphi's prompts) and score each explanation by "
        "detection; starts a job (get_job follows it) and stores the explanations beside the "
        "labels, where search_features finds them.",
        "post",
        "/api/saes/{sae_id}/labels/explain",
        _explain,
        Sae,
        ExplainRequest,
    ),
    McpTool(
        "train_dictionary",
        "Train an SAE (TopK, BatchTopK, JumpReLU or Matryoshka, with SAELens) at a layer of the "
        "served model, or a transcoder per block (kind transcoder_set, registered for attribution "
        "graphs), over a corpus (texts, local files, a saved dataset, or an SAE's shipped "
        "corpus); saves it in SAELens's format with its provenance, registers it, and attaches, "
        "grades, calibrates, labels and explains an SAE as `then` asks. A job: get_training "
        "follows it.",
        "post",
        "/api/saes/train",
        _train,
        body=TrainRequest,
    ),
    McpTool(
        "get_training",
        "A dictionary training's state, progress (tokens, steps, loss, variance explained, L0 and "
        "dead-latent curves) and, once ended, the SAE it made.",
        "get",
        "/api/saes/trainings/{training_id}",
        _training,
        TrainingKey,
        read_only=True,
    ),
    McpTool(
        "grade_dictionary",
        "Grade an attached SAE (or a transcoder block attached as one, on its MLP) on a corpus: "
        "variance explained, L0, dead and dense fractions, CE loss recovered against zero "
        "ablation and KL to the clean next-token distribution (SAEBench's core metrics); starts a "
        "job (get_job follows it) and keeps the card.",
        "post",
        "/api/saes/{sae_id}/grade",
        _grade,
        Sae,
        GradeRequest,
    ),
    McpTool(
        "dictionary_grades",
        "An SAE's grade cards, newest first.",
        "get",
        "/api/saes/{sae_id}/grades",
        _grades,
        Sae,
        read_only=True,
    ),
    McpTool(
        "grade_transcoder_set",
        "Grade a registered transcoder set on a corpus: the replacement model (every MLP replaced "
        "by its transcoder) against the model and every MLP zeroed (CE loss recovered, KL), and "
        "each block's variance explained, L0, dead and dense fractions; starts a job (get_job "
        "follows it) and keeps the card.",
        "post",
        "/api/transcoders/{set_id}/grade",
        _grade_set,
        TranscoderSetKey,
        GradeRequest,
    ),
    McpTool(
        "transcoder_set_grades",
        "A transcoder set's grade cards, newest first.",
        "get",
        "/api/transcoders/{set_id}/grades",
        _set_grades,
        TranscoderSetKey,
        read_only=True,
    ),
    McpTool(
        "get_job",
        "A job's state, progress, ETA, and its result or error once ended.",
        "get",
        "/api/jobs/{job_id}",
        _job,
        Job,
        read_only=True,
    ),
    McpTool(
        "list_batches",
        "Batches (OpenAI's Batch API), newest first: status, counts of lines answered and "
        "failed, and the output and error files' ids once ended.",
        "get",
        "/v1/batches",
        _batches,
        BatchPage,
        read_only=True,
    ),
    McpTool(
        "get_batch",
        "One batch: its status, its request_counts as of its last recorded chunk, why it waits "
        "(millm.waiting_reason), its errors, and its output and error files' ids once ended.",
        "get",
        "/v1/batches/{batch_id}",
        _batch,
        BatchKey,
        read_only=True,
    ),
    McpTool(
        "circuit_claims",
        "The layers active circuits claim: which circuit holds each, whether it is composed "
        "(a sum of circuits), the features it writes there.",
        "get",
        "/api/circuits/claims",
        _circuit_claims,
        read_only=True,
    ),
    McpTool(
        "sensing_status",
        "Cluster co-activation sensing: whether the active cluster is sensed, its members, the "
        "quorum, counters, and every cluster whose sensing is on.",
        "get",
        "/api/sensing/status",
        _sensing_status,
        read_only=True,
    ),
    McpTool(
        "sensing_events",
        "Where the active cluster's members fired together, newest first: span, fired members "
        "with their peaks, score, and the tokens around it.",
        "get",
        "/api/sensing/events",
        _sensing_events,
        ClusterEvents,
        read_only=True,
    ),
    McpTool(
        "enable_sensing",
        "Sense a cluster (by name or id) while it is active: every generation records where its "
        "members fire together.",
        "post",
        "/api/sensing/{cluster_id}/enable",
        _enable_sensing,
        ClusterKey,
    ),
    McpTool(
        "circuit_sensing_status",
        "Circuit edge sensing: the edges sensed, those that cannot be (and why), the lag "
        "allowed, counters.",
        "get",
        "/api/circuit-sensing/status",
        _circuit_sensing_status,
        read_only=True,
    ),
    McpTool(
        "circuit_sensing_events",
        "Where the active circuit's edges were seen, newest first: the upstream and downstream "
        "firings, the lag between them, the edge's evidence rung in its own words.",
        "get",
        "/api/circuit-sensing/events",
        _circuit_sensing_events,
        CircuitEvents,
        read_only=True,
    ),
    McpTool(
        "enable_circuit_sensing",
        "Sense a circuit's edges (by name or id) while it is active.",
        "post",
        "/api/circuit-sensing/{circuit_id}/enable",
        _enable_circuit_sensing,
        CircuitKey,
    ),
    McpTool(
        "monitoring_stats",
        "Per-feature monitoring statistics since the last reset: count, mean and max when active, "
        "fraction of positions.",
        "get",
        "/api/monitoring/stats",
        _monitoring_stats,
        read_only=True,
    ),
)
