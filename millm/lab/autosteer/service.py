"""What AutoSteer offers its route: the search for steering settings that serve a plain-language
goal, as a job (GET /api/jobs/{id} follows it)."""

from __future__ import annotations

from millm.kernel.runtime.jobs import JobView
from millm.lab.autosteer.job import start_autosteer
from millm.lab.autosteer.parts import AutoSteerParts
from millm.lab.autosteer.protocol import AutoSteerRequest


class AutoSteer:
    """The AutoSteer route's one way in."""

    def __init__(self, state: AutoSteerParts):
        self.state = state

    def start(self, body: AutoSteerRequest) -> JobView:
        """Rank steering settings for a plain-language goal."""
        return start_autosteer(self.state, body)
