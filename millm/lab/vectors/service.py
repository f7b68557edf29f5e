"""What the vectors routes do besides the book's reads and writes: train a vector (a job) and
explain one through an SAE's decoder."""

from __future__ import annotations

from anyio import to_thread

from millm.kernel.runtime.jobs import JobView
from millm.lab.vectors.explain import (
    _explanation,
    _sae_at_point,
    _where,
    check_same_point,
)
from millm.lab.vectors.parts import VectorParts
from millm.lab.vectors.protocol import TrainVectorRequest, VectorExplanation
from millm.lab.vectors.training import prepare, run_training
from millm.wording import counted


class VectorTraining:
    """The vectors routes' way to training and explaining."""

    def __init__(self, state: VectorParts):
        self.state = state

    def train(self, body: TrainVectorRequest) -> JobView:
        """Check the request against the loaded model, then start the job (its result is the
        stored vector)."""
        prepared = prepare(self.state, body)
        tokens = sum(map(len, prepared.texts))
        description = (
            f"train steering vector {body.name!r} on {prepared.model} at layer "
            f"{body.layer} ({body.hook_point}) from {counted(len(body.pairs), 'pair')} "
            f"({counted(tokens, 'token')})"
        )
        return self.state.jobs.start(
            "vector",
            description,
            len(prepared.texts),
            "texts",
            lambda handle: run_training(self.state, prepared, handle),
        )

    async def explain(self, key: str, sae_id: str | None, k: int) -> VectorExplanation:
        """The vector's top-k features by |cosine| over the SAE's decoder, with labels and the
        fraction they explain."""
        row = self.state.vectors.find(key)  # memory (the book's shelf)
        info = self.state.saes.get(sae_id) if sae_id is not None else _sae_at_point(self.state, row)
        layer = check_same_point(row, info, _where(self.state, info))
        decoder = await self.state.decoders.of(info.id)
        return await to_thread.run_sync(_explanation, self.state, row, info, layer, decoder, k)
