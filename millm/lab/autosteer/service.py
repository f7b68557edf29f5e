"""What AutoSteer offers its route: the search for steering settings that serve a plain-language
goal, as a job (GET /api/jobs/{id} follows it)."""

from __future__ import annotations

from millm.engine.prompts import chat_prompt_ids
from millm.errors import Conflict, InvalidRequest, ModelNotLoaded
from millm.interp.steering import check_feature, pick_attached
from millm.kernel.runtime.jobs import JobView
from millm.lab.autosteer.inputs import (
    CONTROL_SYSTEM,
    DEFAULT_PROBES,
    GOAL_SYSTEM,
    PreparedAutoSteer,
    primed_ids,
)
from millm.lab.autosteer.job import run_autosteer
from millm.lab.autosteer.parts import AutoSteerParts
from millm.lab.autosteer.protocol import DEFAULT_FRACTIONS, AutoSteerRequest
from millm.lab.discovery.judge import judge_for


class AutoSteer:
    """The AutoSteer route's one way in."""

    def __init__(self, state: AutoSteerParts):
        self.state = state

    def start(self, body: AutoSteerRequest) -> JobView:
        """Check the request against the loaded model and start the job (its view is the answer)."""
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to steer; load one first")
        attached = pick_attached(self.state.steering.attached, body.sae_id, "sae_id")
        if attached.reach > 1:
            raise InvalidRequest(
                f"{attached.info.id} is a block of a cross-layer transcoder, whose features write "
                "into several blocks; AutoSteer sweeps one write per feature: steer it by hand",
                param="sae_id",
            )
        for i, index in enumerate(body.include or ()):
            check_feature(attached.info, index, param=f"include[{i}]")
        if body.include is not None and len(set(body.include)) != len(body.include):
            raise InvalidRequest("include names a feature twice", param="include")
        judge = judge_for(lm.tokenizer, body.goal)
        if (
            body.save_as is not None
            and self.state.profiles.shelf.by_name.get(body.save_as) is not None
        ):
            raise Conflict(
                f"a profile named {body.save_as!r} exists; choose another save_as",
                param="save_as",
                code="profile_exists",
            )
        probes = tuple(body.probe_prompts or DEFAULT_PROBES)
        probe_ids = tuple(
            tuple(chat_prompt_ids(lm.tokenizer, [{"role": "user", "content": p}])) for p in probes
        )
        goal_ids = tuple(
            tuple(primed_ids(lm.tokenizer, GOAL_SYSTEM.format(goal=body.goal), p)) for p in probes
        )
        control_ids = tuple(tuple(primed_ids(lm.tokenizer, CONTROL_SYSTEM, p)) for p in probes)
        prepared = PreparedAutoSteer(
            body, lm.name, attached, judge, probes, probe_ids, goal_ids, control_ids, lm.tokenizer
        )
        sweep = len(body.strengths or body.strength_fractions or DEFAULT_FRACTIONS)
        return self.state.jobs.start(
            "autosteer",
            f"AutoSteer {body.goal!r} through {attached.info.id}",
            (body.candidates + len(body.include or ())) * sweep,
            "settings",
            lambda handle: run_autosteer(self.state, prepared, handle).model_dump(),
        )
