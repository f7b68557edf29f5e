"""What training offers the routes: jobs that fit probes and steering vectors, and AutoSteer's
search. Each starts a job (GET /api/jobs/{id} follows it) and stores what it made."""

from __future__ import annotations

from millm.protocol.autosteer import AutoSteerRequest
from millm.protocol.vectors import TrainVectorRequest
from millm.service.composition import ServerState
from millm.service.runtime.jobs import JobView
from millm.service.training import probes, vectors
from millm.service.training.autosteer import start_autosteer
from millm.service.training.probes import ProbeTrainRequest


class Training:
    """The training routes' one way in."""

    def __init__(self, state: ServerState):
        self.state = state

    def train_probe(self, body: ProbeTrainRequest) -> JobView:
        """Fit a linear probe from labelled texts."""
        return probes.start_training(self.state, body)

    def train_vector(self, body: TrainVectorRequest) -> JobView:
        """Fit a steering vector from contrasting pairs."""
        return vectors.start_training(self.state, body)

    def autosteer(self, body: AutoSteerRequest) -> JobView:
        """Rank steering settings for a plain-language goal."""
        return start_autosteer(self.state, body)
