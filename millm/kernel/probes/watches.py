"""Probes watching a request: its `probes` field parsed, the active probes added, each a report
Watch on every row, and the verdicts turned into the body's `millm.probes`.

Order of the checks, as a client would fix them: the field's syntax and the names it gives
(before any model is acquired); then, once the model is held, whether each probe fits it (its
SAE attached, its percentile calibrated, its width and layer). A probe the request names that
does not fit is a 400 naming it; an active probe that does not fit (its SAE detached since it
was activated) is skipped, and the body says so under `millm.probes_skipped`: an operator's
setting must not fail every request. A probe both named and active watches once.

Verdicts come from the engine when each row ends; their tokens are decoded on a worker thread
(tokenising never runs on the event loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anyio import to_thread

from millm.engine.jobs import ProbeVerdict, Watch
from millm.engine.loader import LoadedModel
from millm.errors import InvalidRequest, MillmError, NotFound
from millm.formats.probe_documents import PROBES_PARAM, InlineProbe
from millm.interp.probes import verdict_fields, watch_of
from millm.interp.steering import Attached
from millm.kernel.books.calibrations import CalibrationBook
from millm.kernel.probes.binding import bind
from millm.kernel.probes.book import ProbeBook


@dataclass(frozen=True)
class Asked:
    """A probe a request asked for: its name, detector, and where in the body it was given."""

    name: str
    detector: dict
    param: str  # "probes[2]"
    saved: bool  # a saved probe named (else defined inline)


def parse_probes(probes: ProbeBook, sent: list[str | InlineProbe] | None) -> tuple[Asked, ...]:
    """The request's `probes` (parsed with its body): names of saved probes (404 probe_not_found
    naming the entry) and inline definitions, each name once. Blocking (the probe book): a worker
    thread."""
    asked: list[Asked] = []
    for i, item in enumerate(sent or ()):
        where = f"{PROBES_PARAM}[{i}]"
        if isinstance(item, str):
            try:
                row = probes.find(item)
            except NotFound as exc:
                exc.param = where
                raise
            name, detector = row["name"], row["document"]["detector"]
        else:
            inline = item.model_dump(exclude_none=True)
            name, detector = inline.get("name", where), inline["detector"]
        if any(a.name == name for a in asked):
            raise InvalidRequest(
                f"{where} names probe {name!r}, listed before it; list each probe once", param=where
            )
        asked.append(Asked(name, detector, where, isinstance(item, str)))
    return tuple(asked)


@dataclass(frozen=True)
class ProbeSet:
    """The watches a request's rows carry, where each came from, and what was left out."""

    watches: tuple[Watch, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)  # name -> "request" | "active"
    skipped: tuple[dict, ...] = ()  # active probes that do not fit the loaded model: {name, reason}
    tokenizer: object = None

    @property
    def active(self) -> frozenset[str]:
        """Names of the active probes among the watches (monitoring records their verdicts)."""
        return frozenset(name for name, source in self.sources.items() if source == "active")

    def with_conditions(self, conditions: tuple[Watch, ...], tokenizer: object) -> ProbeSet:
        """These watches and a plan's conditions (`when`, `abort`), whose verdicts say `source:
        condition`."""
        if not conditions:
            return self
        return ProbeSet(self.watches + conditions, self.sources, self.skipped, tokenizer)

    def entries(self, verdicts: list[ProbeVerdict]) -> list[dict]:
        """One entry per verdict, by row then watch order, with each firing token's text.
        Blocking (decoding)."""
        order = {watch.name: i for i, watch in enumerate(self.watches)}
        thresholds = {watch.name: watch.threshold for watch in self.watches}
        decode = self.tokenizer.decode  # type: ignore[attr-defined]  # a transformers tokenizer
        out = []
        for verdict in sorted(
            verdicts, key=lambda v: (v.row, order.get(v.name, len(order)), v.name)
        ):
            fields = verdict_fields(verdict)
            token_ids = fields.pop("token_ids")
            out.append(
                {
                    "index": verdict.row,
                    **fields,
                    "threshold": thresholds.get(verdict.name),
                    "source": self.sources.get(verdict.name, "condition"),
                    "tokens": [{"id": token, "text": decode([token])} for token in token_ids],
                }
            )
        return out

    async def block(self, verdicts: list[ProbeVerdict]) -> dict | None:
        """The `millm` keys the verdicts make (None when nothing watched and nothing was
        skipped)."""
        if not verdicts and not self.skipped:
            return None
        block: dict = {"probes": await to_thread.run_sync(self.entries, verdicts)}
        if self.skipped:
            block["probes_skipped"] = list(self.skipped)
        return block


NO_PROBES = ProbeSet()


def watch_request(
    probes: ProbeBook,
    calibrations: CalibrationBook,
    attached: dict[str, Attached],
    lm: LoadedModel,
    asked: tuple[Asked, ...],
) -> ProbeSet:
    """The request's probes and the active ones, bound to `lm` as report watches (a 400 naming the
    request's probe that does not fit; active ones that do not fit are skipped). Blocking: a
    worker thread."""
    watches, sources = [], {}
    for probe in asked:
        watches.append(
            watch_of(
                bind(
                    attached,
                    calibrations,
                    lm,
                    probe.name,
                    probe.detector,
                    f"{probe.param}.detector",
                )
            )
        )
        sources[probe.name] = "request"
    skipped = []
    saved = {probe.name for probe in asked if probe.saved}
    for row in probes.active():
        name = row["name"]
        if name in saved:
            sources[name] = "active"  # named and active: one watch, recorded by monitoring
            continue
        if name in sources:
            where = next(probe.param for probe in asked if probe.name == name)
            raise InvalidRequest(
                f"{where} is named like the active probe {name!r}; give the inline probe another "
                "name",
                param=f"{where}.name",
            )
        try:
            watches.append(
                watch_of(
                    bind(attached, calibrations, lm, name, row["document"]["detector"], "detector")
                )
            )
        except MillmError as exc:
            skipped.append({"name": name, "reason": exc.message})
            continue
        sources[name] = "active"
    if not watches and not skipped:
        return NO_PROBES
    return ProbeSet(tuple(watches), sources, tuple(skipped), lm.tokenizer)
