"""What discovery offers the routes: inspect a text, contrast two sets, read a text through the
logit lens. Each reads through attached SAEs on the loaded model; none changes what is stored."""

from __future__ import annotations

from millm.lab.discovery.contrast import contrast_sets
from millm.lab.discovery.inspection import inspect_text
from millm.lab.discovery.lens import logit_lens
from millm.lab.discovery.lens_protocol import LensRequest, LensResponse
from millm.lab.discovery.parts import DiscoveryParts
from millm.lab.discovery.protocol import (
    ContrastRequest,
    ContrastResponse,
    InspectRequest,
    InspectResponse,
)


class Discovery:
    """The discovery routes' one way in."""

    def __init__(self, state: DiscoveryParts):
        self.state = state

    async def inspect(self, sae_id: str, body: InspectRequest) -> InspectResponse:
        """Which features of an attached SAE fire on one text or conversation, and where."""
        return await inspect_text(self.state, sae_id, body)

    async def contrast(self, sae_id: str, body: ContrastRequest) -> ContrastResponse:
        """The features that best separate two sets of texts."""
        return await contrast_sets(self.state, sae_id, body)

    async def lens(self, body: LensRequest) -> LensResponse:
        """POST /api/lens: what each block's residual predicts at each position."""
        return await logit_lens(self.state, body)
