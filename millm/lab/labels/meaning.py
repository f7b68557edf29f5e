"""Label search by meaning: labels and the query as embeddings, ranked by cosine, and fused with
the text search.

The embedder is the served model (its /v1/embeddings: mean-pooled final hidden states, never
steered) or an OpenAI-compatible `/embeddings` endpoint the operator names
(MILLM_EMBEDDINGS_BASE_URL and MILLM_EMBEDDINGS_MODEL). An SAE's label texts (each feature's label,
or its best explanation when it has none: what the text search finds it by) are embedded on the
first search by meaning (or ahead of it by a job, POST /api/saes/{id}/labels/embeddings, in
batches with progress) and kept, per SAE and embedder, until its labels change; a search that
finds them being made waits for them instead of making them again; the query is embedded on
every search. `both` fuses the two rankings by reciprocal rank (each list contributes
1 / (RRF_K + rank)), so a label found by either way ranks, and one found by both ranks higher:
"sea voyage" finds a "pirate ship" feature that shares none of its words.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import httpx
import numpy as np

from millm.errors import ModelNotLoaded
from millm.kernel.books.label_search import FeatureMatch
from millm.kernel.runtime.blocking import embed_blocking
from millm.kernel.runtime.remote import post_json
from millm.lab.labels.parts import LabelParts
from millm.v1.serving.prompts import embedding_inputs

RRF_K = 60  # the usual constant of reciprocal rank fusion
EMBED_BATCH = 128  # label texts per embedding call (a job's progress; serving goes on between)
KEPT = 4  # SAEs whose label embeddings stay in memory
ENDPOINT_TIMEOUT_S = 60.0
ENDPOINT_BATCH = 256  # texts per endpoint request


class Embedder(Protocol):
    """Turns texts into vectors `[n, d]`."""

    @property
    def name(self) -> str:
        """What made the vectors (the cache's key)."""
        ...

    def vectors(self, texts: list[str]) -> np.ndarray:
        """One vector per text."""
        ...


class ServedEmbedder:
    """The loaded model's embeddings, through the scheduler."""

    def __init__(self, state: LabelParts):
        lm = state.switch.lm
        if lm is None:
            raise ModelNotLoaded(
                "searching labels by meaning embeds them with the served model: load one "
                "(or name an embedding endpoint: MILLM_EMBEDDINGS_BASE_URL)"
            )
        self.state, self.lm = state, lm

    @property
    def name(self) -> str:
        return f"served:{self.lm.name}"

    def vectors(self, texts: list[str]) -> np.ndarray:
        prompts = embedding_inputs(self.lm, texts)
        found = embed_blocking(self.state.switch, self.lm.name, prompts)
        assert found is not None  # nothing cancels it
        return found


class EndpointEmbedder:
    """An OpenAI-compatible embeddings server the operator configured."""

    def __init__(self, base_url: str, model: str, api_key: str | None):
        self.url = base_url.rstrip("/") + "/embeddings"
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @property
    def name(self) -> str:
        return f"endpoint:{self.model}"

    def vectors(self, texts: list[str]) -> np.ndarray:
        out = []
        with httpx.Client(timeout=ENDPOINT_TIMEOUT_S, headers=self.headers) as client:
            for start in range(0, len(texts), ENDPOINT_BATCH):
                batch = texts[start : start + ENDPOINT_BATCH]
                body = {"model": self.model, "input": batch}
                answer = post_json(client, self.url, body, "embeddings endpoint")
                data = sorted(answer["data"], key=lambda item: item["index"])
                out += [item["embedding"] for item in data]
        return np.asarray(out, dtype=np.float32)


def embedder_for(state: LabelParts) -> Embedder:
    """The configured endpoint, else the served model."""
    settings = state.settings
    if settings.embeddings_base_url and settings.embeddings_model:
        key = settings.embeddings_api_key
        return EndpointEmbedder(
            settings.embeddings_base_url,
            settings.embeddings_model,
            key.get_secret_value() if key is not None else None,
        )
    return ServedEmbedder(state)


def unit(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (a zero row stays zero)."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1.0, norms)


@dataclass(frozen=True)
class _Embedded:
    matches: list[FeatureMatch]  # each feature's searched row (score left empty)
    vectors: np.ndarray  # unit rows, one per match


class MeaningBook:
    """Per SAE and embedder, its label texts' embeddings (kept until the labels change)."""

    def __init__(self, kept: int = KEPT):
        self._lock = threading.Lock()
        self._kept = kept
        self._sets: OrderedDict[tuple[str, str, int], _Embedded] = OrderedDict()
        self._making: dict[tuple[str, str, int], threading.Event] = {}

    def embedded(
        self,
        embedder: Embedder,
        sae_id: str,
        version: int,
        rows: list[FeatureMatch],
        progress: Callable[[int], None] | None = None,
    ) -> _Embedded:
        """The SAE's label embeddings at `version`: kept, or made now in batches (`progress`
        hears of each; an exception it raises stops the making), or, while another caller makes
        them, theirs once made (blocking)."""
        key = (sae_id, embedder.name, version)
        while True:
            with self._lock:
                held = self._sets.get(key)
                if held is not None:
                    self._sets.move_to_end(key)
                    return held
                making = self._making.get(key)
                if making is None:
                    making = self._making[key] = threading.Event()
                    break
            making.wait()  # made (found on the next look), or failed (made here then)
        try:
            parts = []
            for start in range(0, len(rows), EMBED_BATCH):
                chunk = rows[start : start + EMBED_BATCH]
                parts.append(embedder.vectors([row.label for row in chunk]))
                if progress is not None:
                    progress(len(chunk))
            held = _Embedded(rows, unit(np.concatenate(parts)) if parts else np.zeros((0, 0)))
            with self._lock:
                self._sets[key] = held
                while len(self._sets) > self._kept:
                    self._sets.popitem(last=False)
            return held
        finally:
            with self._lock:
                self._making.pop(key, None)
            making.set()

    def made(self, embedder: Embedder, sae_id: str, version: int) -> bool:
        """Whether the SAE's label embeddings at `version` are made and kept (a search by meaning
        would not wait to make them)."""
        with self._lock:
            return (sae_id, embedder.name, version) in self._sets

    def search(
        self,
        embedder: Embedder,
        sae_id: str,
        version: int,
        rows: list[FeatureMatch],
        query: str,
        limit: int,
    ) -> list[FeatureMatch]:
        """The `limit` rows nearest `query` by cosine (score: the cosine), nearest first."""
        if not rows or not query.strip():
            return []
        held = self.embedded(embedder, sae_id, version, rows)
        asked = unit(embedder.vectors([query]))[0]
        cosines = held.vectors @ asked
        order = sorted(range(len(held.matches)), key=lambda i: (-cosines[i], held.matches[i].index))
        return [
            held.matches[i].model_copy(update={"score": float(cosines[i])}) for i in order[:limit]
        ]


def fused(text: list[FeatureMatch], meaning: list[FeatureMatch], limit: int) -> list[FeatureMatch]:
    """Both rankings fused by reciprocal rank: score = Σ 1 / (RRF_K + rank), rank from 1."""
    scores: dict[int, float] = {}
    rows: dict[int, FeatureMatch] = {}
    for ranking in (text, meaning):
        for rank, match in enumerate(ranking, 1):
            scores[match.index] = scores.get(match.index, 0.0) + 1 / (RRF_K + rank)
            rows.setdefault(match.index, match)
    order = sorted(scores, key=lambda index: (-scores[index], index))
    return [rows[index].model_copy(update={"score": scores[index]}) for index in order[:limit]]
