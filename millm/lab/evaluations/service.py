"""/api/evaluations: start a steering evaluation (a job), read, export and delete the results."""

from __future__ import annotations

import uuid

from millm.errors import InvalidRequest, ModelNotLoaded
from millm.kernel.runtime.jobs import JobView
from millm.lab.evaluations.book import EvaluationBook
from millm.lab.evaluations.job import (
    DEFAULT_INSTRUCTIONS,
    MAX_ANSWERS,
    PREFIX,
    PreparedEvaluation,
    prompt_of,
    run_evaluation,
)
from millm.lab.evaluations.judges import judge_for
from millm.lab.evaluations.parts import EvaluationParts
from millm.lab.evaluations.protocol import EvaluationRequest
from millm.lab.evaluations.sweep import resolve
from millm.wording import counted


class EvaluationManagement:
    """Steering evaluations as the API presents them."""

    def __init__(self, state: EvaluationParts, book: EvaluationBook):
        self.state = state
        self.book = book

    def start(self, body: EvaluationRequest) -> JobView:
        """Check the request against the loaded model, then start the job (its view is the
        answer)."""
        lm = self.state.switch.lm
        if lm is None:
            raise ModelNotLoaded("no model is loaded to evaluate; load one first")
        self.book.check_room()
        instructions = tuple(body.instructions or DEFAULT_INSTRUCTIONS)
        sweeps = tuple(resolve(self.state, body))
        settings = 1 + sum(len(sweep.settings) for sweep in sweeps)
        if settings * len(instructions) > MAX_ANSWERS:
            raise InvalidRequest(
                f"this evaluation makes {settings * len(instructions)} answers ({settings} "
                f"settings, the unsteered baseline included, x {len(instructions)} instructions); "
                f"at most {MAX_ANSWERS}: sweep fewer strengths",
                param="candidates",
            )
        for sweep in sweeps:  # a template without a system role refuses the prompting baseline now
            for setting in sweep.settings:
                if setting.system is not None:
                    try:
                        prompt_of(lm.tokenizer, instructions[0], setting.system)
                    except Exception as exc:
                        raise InvalidRequest(
                            f"{lm.name}'s chat template cannot take the prompting baseline's "
                            f"system message ({exc})",
                            param="candidates",
                        ) from None
        longest = max(len(prompt_of(lm.tokenizer, text, None)) for text in instructions)
        if longest + body.max_tokens > lm.context_length:
            raise InvalidRequest(
                f"an instruction ({longest} tokens) and max_tokens {body.max_tokens} exceed the "
                f"model's window ({lm.context_length} tokens)",
                param="max_tokens",
            )
        hypotheses = tuple(dict.fromkeys((*instructions, *DEFAULT_INSTRUCTIONS)))
        judge = judge_for(self.state, body.judge, lm.name, lm.tokenizer, hypotheses)
        prep = PreparedEvaluation(
            PREFIX + uuid.uuid4().hex[:12], body, lm.name, lm.tokenizer, instructions, sweeps, judge
        )
        return self.state.jobs.start(
            "evaluation",
            f"Evaluate {counted(len(sweeps), 'candidate')} for {body.concept!r} over "
            f"{counted(len(instructions), 'instruction')}",
            settings,
            "settings",
            lambda handle: run_evaluation(self.state, prep, self.book, handle).model_dump(
                mode="json"
            ),
        )
