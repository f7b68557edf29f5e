"""A batch's scoring line run in slices, so that interactive work never waits a whole pass for it.

A background scoring job's passes pause (paused.py) whenever an interactive job is waiting, or
when its slice of time is up; the scheduler runs the waiting work and resumes the line where it
stopped. Where a pass can pause depends on the runner:

- the lean runner: between two blocks, free of cost, and the same operations on the same shapes,
  so the line's logits are a pass alone's bit for bit;
- llama.cpp: between chunks of the prompt's tokens, each one decode into the line's own
  sequence. Small chunks cost throughput (each decode reads every weight once), so a line runs in
  chunks of PAUSE_TOKENS only while interactive requests come (one in the last RECENT_SECONDS),
  else of ALONE_TOKENS (never leaving one token for last: a one-token decode runs on other
  kernels). Chunks alone change no logit; a chat run between them may put its KV cells between
  the line's, and llama.cpp sums attention in the order of the cells, so the last bits may move,
  as they do for any row beside others in its shared cache;
- transformers' own forward (families the lean runner does not know): whole passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from millm.engine.jobs import ScoringJob
from millm.engine.loader import LoadedModel
from millm.engine.prefix_cache import PrefixCache
from millm.engine.scoring import scoring_steps

# Tokens per decode of a paused line on llama.cpp. Measured on the demo model (2 cores, lines of
# ~47 tokens): whole 131-152 ms a line, chunks of 16 150 ms, of 8 183 ms, of 4 190 ms; a chat's
# own prefill ~16 ms. Beside chats sent one a second, a chat's median first text was 1.56x an idle
# server's with chunks of 8 (4,000 lines); 4 halves the wait for the chunk running for 4 % more.
PAUSE_TOKENS = 4
ALONE_TOKENS = 64  # bounds the first chat's wait after a quiet spell; ~5 % of a decode's cost
RECENT_SECONDS = 10.0


def chunk_tokens(last_interactive: float) -> int:
    """Tokens in the next chunk of a paused line on llama.cpp, given when the last interactive job
    was admitted (time.monotonic())."""
    return PAUSE_TOKENS if time.monotonic() - last_interactive < RECENT_SECONDS else ALONE_TOKENS


class PausedScoring:
    """A background scoring job's passes, run a slice at a time (`run`)."""

    def __init__(
        self,
        lm: LoadedModel,
        job: ScoringJob,
        cache: PrefixCache | None,
        chunk: Callable[[], int | None] | None = None,
    ):
        self.job = job
        self.pauses = 0  # times it stopped for other work
        self._steps = scoring_steps(lm, job, cache, chunk)
        self._gap: bool | None = None  # sent on resuming: True when other work may have run

    def run(self, interrupted: Callable[[], bool], budget: float | None) -> bool:
        """Run blocks until the job ends (True), or until `interrupted()` says interactive work
        waits or `budget` seconds have passed (False: paused, to be run again)."""
        began = time.monotonic()
        while True:
            try:
                self._steps.send(self._gap)
            except StopIteration:
                return True
            self._gap = None
            if interrupted() or (budget is not None and time.monotonic() - began >= budget):
                self._gap = True
                self.pauses += 1
                return False

    def close(self) -> None:
        """Abandon it (the server stops with an error); its job is answered by the caller. Called
        on the scheduler thread, as its cleanup touches the model's residual hooks."""
        self._steps.close()
