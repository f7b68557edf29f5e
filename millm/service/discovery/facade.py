"""What discovery offers the routes: inspect a text, contrast two sets, compare steerings, explain
a vector, read a text through the logit lens. Each reads through attached SAEs on the loaded model; none changes what is stored."""

from __future__ import annotations

from millm.protocol.compare import CompareRequest
from millm.protocol.discovery import (
    ContrastRequest,
    ContrastResponse,
    InspectRequest,
    InspectResponse,
)
from millm.protocol.lens import LensRequest, LensResponse
from millm.protocol.vectors import VectorExplanation
from millm.service.composition import ServerState
from millm.service.discovery.compare import compare
from millm.service.discovery.contrast import contrast_sets
from millm.service.discovery.inspection import inspect_text
from millm.service.discovery.lens import logit_lens
from millm.service.discovery.vector_explain import explain_vector
from millm.service.serving.replies import Reply


class Discovery:
    """The discovery routes' one way in."""

    def __init__(self, state: ServerState):
        self.state = state

    async def inspect(self, sae_id: str, body: InspectRequest) -> InspectResponse:
        """Which features of an attached SAE fire on one text or conversation, and where."""
        return await inspect_text(self.state, sae_id, body)

    async def contrast(self, sae_id: str, body: ContrastRequest) -> ContrastResponse:
        """The features that best separate two sets of texts."""
        return await contrast_sets(self.state, sae_id, body)

    async def compare(self, body: CompareRequest, strict: bool) -> Reply:
        """One conversation generated under several steering variants."""
        return await compare(self.state, body, strict)

    async def lens(self, body: LensRequest) -> LensResponse:
        """POST /api/lens: what each block's residual predicts at each position."""
        return await logit_lens(self.state, body)

    async def explain_vector(self, key: str, sae_id: str | None, k: int) -> VectorExplanation:
        """A steering vector decomposed over an SAE's decoder, with labels."""
        return await explain_vector(self.state, key, sae_id, k)
