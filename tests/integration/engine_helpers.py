"""Run engine jobs synchronously in the test thread and collect what they emit."""

from __future__ import annotations

from dataclasses import dataclass, field

from millm.engine.generate import run_job
from millm.engine.jobs import GenerationJob, JobFailed, RowFinished, RowSpec, TextDelta
from millm.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@dataclass
class Outcome:
    texts: dict[int, str] = field(default_factory=dict)
    finish: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    failed: list = field(default_factory=list)
    events: list = field(default_factory=list)

    def record(self, event):
        self.events.append(event)
        if isinstance(event, TextDelta):
            self.texts[event.row] = self.texts.get(event.row, "") + event.text
        elif isinstance(event, RowFinished):
            self.finish[event.row] = event.finish_reason
            self.tokens[event.row] = event.completion_tokens
        elif isinstance(event, JobFailed):
            self.failed.append(event.error)


def row(prompt, max_tokens=20, sampling=GREEDY, stop=(), seed=None, edit=None) -> RowSpec:
    return RowSpec(
        prompt_ids=tuple(prompt),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=tuple(stop),
        seed=seed,
        edit=edit,
    )


def generate(lm, rows: list[RowSpec]) -> Outcome:
    outcome = Outcome()
    run_job(lm, GenerationJob(rows=rows, emit=outcome.record))
    return outcome


def logits_of(lm, prompts: list[list[int]], edit=None):
    """Next-token logits `[B, V]` of one prefill of `prompts`, every row under `edit` (None:
    unsteered)."""
    lm.residual.install(lm.residual.stack([edit] * len(prompts)))
    try:
        _, logits = lm.runner.prefill(prompts, capacity=max(map(len, prompts)) + 1)
    finally:
        lm.residual.clear()
    return logits


def prompt_ids(lm, text: str) -> list[int]:
    return lm.tokenizer(text, add_special_tokens=True)["input_ids"]
