"""What the vectors routes do besides the book's reads and writes: train a vector (a job) and
explain one through an SAE's decoder."""

from __future__ import annotations

from millm.kernel.runtime.jobs import JobView
from millm.lab.vectors.explain import explain_vector
from millm.lab.vectors.parts import VectorParts
from millm.lab.vectors.protocol import TrainVectorRequest, VectorExplanation
from millm.lab.vectors.training import start_training


class VectorTraining:
    """The vectors routes' way to training and explaining."""

    def __init__(self, state: VectorParts):
        self.state = state

    def train(self, body: TrainVectorRequest) -> JobView:
        """Fit a steering vector from contrasting pairs."""
        return start_training(self.state, body)

    async def explain(self, key: str, sae_id: str | None, k: int) -> VectorExplanation:
        """A steering vector decomposed over an SAE's decoder, with labels."""
        return await explain_vector(self.state, key, sae_id, k)
