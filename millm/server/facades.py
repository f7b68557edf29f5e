"""The one way in from the API: each capability's service, made once over the composed state. The
HTTP routes (through `part(request, Kind)`) and the MCP tools call these and nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from millm.kernel.books.vectors import VectorBook
from millm.kernel.model.switch import ModelSwitch
from millm.kernel.monitoring.monitor import Monitor
from millm.kernel.runtime.jobs import JobBook
from millm.kernel.sensing.sensing import Sensing
from millm.kernel.state import ServerState
from millm.lab.attribution.service import Attribution
from millm.lab.autosteer.service import AutoSteer
from millm.lab.calibration.service import CalibrationManagement
from millm.lab.compare.service import Comparer
from millm.lab.dictionaries.service import Dictionaries
from millm.lab.discovery.service import Discovery
from millm.lab.documents.claims import CircuitServing
from millm.lab.documents.service import BaseManagement
from millm.lab.ember.catalogue import EmberFeatures
from millm.lab.ember.service import Ember
from millm.lab.evaluations.book import EvaluationBook
from millm.lab.evaluations.service import EvaluationManagement
from millm.lab.labels.labelling import Labelling
from millm.lab.labels.meaning import MeaningBook
from millm.lab.labels.service import FeatureManagement
from millm.lab.models.service import ModelManagement
from millm.lab.monitoring.service import MonitorManagement
from millm.lab.probes.scoring import ProbeScoring
from millm.lab.probes.service import ProbeManagement
from millm.lab.sensing.service import SensingManagement
from millm.lab.steering.service import SteeringManagement
from millm.lab.variants.service import VariantManagement
from millm.lab.vectors.service import VectorTraining
from millm.settings import Settings
from millm.v1.batches.service import Batches
from millm.v1.files.service import Files
from millm.v1.models.serving import ModelListing
from millm.v1.responses.serving import ResponsesApi
from millm.v1.serving.serving import Serving
from millm.v1.tokenizer.serving import Tokenizers

T = TypeVar("T")


@dataclass(frozen=True)
class Facades:
    """Each capability's service, and the kernel's parts whose reads a route takes as they are
    (the monitor, the vectors' and the evaluations' books); `requests` opens the scope a
    request's model leases live in. A route asks for one by its kind (`of`)."""

    settings: Settings
    requests: ModelSwitch
    serving: Serving
    tokenizers: Tokenizers
    files: Files
    batches: Batches
    responses: ResponsesApi
    models: ModelManagement
    listing: ModelListing
    steering: SteeringManagement
    bases: BaseManagement
    circuit_serving: CircuitServing
    features: FeatureManagement
    calibrations: CalibrationManagement
    dictionaries: Dictionaries
    monitoring: MonitorManagement
    monitor: Monitor
    sensing: SensingManagement
    sensed: Sensing
    probes: ProbeManagement
    probe_scoring: ProbeScoring
    vectors: VectorBook
    vector_training: VectorTraining
    variants: VariantManagement
    evaluations: EvaluationManagement
    evaluation_book: EvaluationBook
    discovery: Discovery
    comparison: Comparer
    attribution: Attribution
    autosteer: AutoSteer
    ember: Ember
    ember_features: EmberFeatures
    labelling: Labelling
    jobs: JobBook
    close: Callable[[], None]  # the state's close, for the app's shutdown

    def __post_init__(self) -> None:
        values = list(vars(self).values())
        parts = {type(value): value for value in values}
        # A kind held twice would make `of` answer one of them at random.
        assert len(parts) == len(values), "two facades of one kind"
        object.__setattr__(self, "_by_kind", parts)

    def of(self, kind: type[T]) -> T:
        """The one part of this kind (how a route reaches its capability's service)."""
        return self._by_kind[kind]  # type: ignore[attr-defined]  # made in __post_init__


def build_facades(state: ServerState) -> Facades:
    """Every facade over one composed state."""
    serving = Serving(state)
    evaluation_book = EvaluationBook(state.store)
    probe_scoring = ProbeScoring(state)
    bases = BaseManagement(state)
    features = FeatureManagement(state, MeaningBook())
    discovery, autosteer, attribution = Discovery(state), AutoSteer(state), Attribution(state)
    return Facades(
        settings=state.settings,
        requests=state.switch,
        serving=serving,
        tokenizers=Tokenizers(state),
        files=Files(state),
        batches=Batches(state, serving, {"/api/probes/score": probe_scoring}),
        responses=ResponsesApi(serving, state.store),
        models=ModelManagement(state),
        listing=ModelListing(state),
        steering=SteeringManagement(state),
        bases=bases,
        circuit_serving=CircuitServing(state, bases),
        features=features,
        calibrations=CalibrationManagement(state),
        dictionaries=Dictionaries(state),
        monitoring=MonitorManagement(state),
        monitor=state.monitor,
        sensing=SensingManagement(state),
        sensed=state.sensing,
        probes=ProbeManagement(state),
        probe_scoring=probe_scoring,
        vectors=state.vectors,
        vector_training=VectorTraining(state),
        variants=VariantManagement(state),
        evaluations=EvaluationManagement(state, evaluation_book),
        evaluation_book=evaluation_book,
        discovery=discovery,
        comparison=Comparer(state),
        attribution=attribution,
        autosteer=autosteer,
        ember=Ember(state, serving, features, discovery, autosteer, attribution, state.jobs),
        ember_features=EmberFeatures(state, features),
        labelling=Labelling(state),
        jobs=state.jobs,
        close=state.close,
    )
