"""The one way in from the API: a facade per capability, made once over the composed state. The
HTTP routes and the MCP tools call these and nothing else of the service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from millm.service.attribution.facade import Attribution
from millm.service.composition import ServerState
from millm.service.discovery.facade import Discovery
from millm.service.labelling.facade import Labelling
from millm.service.manage.bases import BaseManagement
from millm.service.manage.calibrations import CalibrationManagement
from millm.service.manage.evaluations import EvaluationManagement
from millm.service.manage.features import FeatureManagement
from millm.service.manage.models import ModelManagement
from millm.service.manage.monitoring import MonitorManagement
from millm.service.manage.probes import ProbeManagement
from millm.service.manage.steering import SteeringManagement
from millm.service.manage.variants import VariantManagement
from millm.service.models.switch import ModelSwitch
from millm.service.responses.api import ResponsesApi
from millm.service.runtime.jobs import JobBook
from millm.service.serving.serving import Serving
from millm.service.serving.tokenizer import Tokenizers
from millm.service.steering.vectors import VectorBook
from millm.service.training.facade import Training
from millm.settings import Settings


@dataclass(frozen=True)
class Facades:
    """Each capability's facade; `requests` opens the scope a request's model leases live in."""

    settings: Settings
    requests: ModelSwitch
    serving: Serving
    tokenizers: Tokenizers
    responses: ResponsesApi
    models: ModelManagement
    steering: SteeringManagement
    bases: BaseManagement
    features: FeatureManagement
    calibrations: CalibrationManagement
    monitoring: MonitorManagement
    probes: ProbeManagement
    vectors: VectorBook
    variants: VariantManagement
    evaluations: EvaluationManagement
    discovery: Discovery
    attribution: Attribution
    training: Training
    labelling: Labelling
    jobs: JobBook
    close: Callable[[], None]  # the state's close, for the app's shutdown


def build_facades(state: ServerState) -> Facades:
    """Every facade over one composed state."""
    serving = Serving(state)
    return Facades(
        settings=state.settings,
        requests=state.switch,
        serving=serving,
        tokenizers=Tokenizers(state),
        responses=ResponsesApi(serving, state.store),
        models=ModelManagement(state),
        steering=SteeringManagement(state),
        bases=BaseManagement(state),
        features=FeatureManagement(state),
        calibrations=CalibrationManagement(state),
        monitoring=MonitorManagement(state),
        probes=ProbeManagement(state),
        vectors=state.vectors,
        variants=VariantManagement(state),
        evaluations=EvaluationManagement(state),
        discovery=Discovery(state),
        attribution=Attribution(state),
        training=Training(state),
        labelling=Labelling(state),
        jobs=state.jobs,
        close=state.close,
    )
