"""Grading an attached dictionary as a job: each window run three times on the served model (clean,
with the dictionary's reconstruction spliced in at its point, with that point zeroed), summed into
SAEBench's core figures (interp/grading.py), kept as a card.

Each window is one CallJob on the scheduler thread (torch stays there): three passes through the
served model's own runner and kernels, the splice and the ablation as residual operations, so the
figures are those of the model as millm serves it (llama.cpp's graph included).

A transcoder (a block's file attached as an SAE) is graded on its block's MLP: what it predicts
from the MLP's input against what the MLP adds to the residual (the block's own MLP re-run in
float32 from the lean runner's layout, as a transcoder training's target is), spliced in place of
that output, and the MLP zero-ablated. A model served on llama.cpp is graded on a transformers copy
of its file held beside it (steps.mlp_engine).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit, SourcedOperation, mlp_input
from millm.errors import InvalidRequest
from millm.interp.attribution.replacement import ReplacementModel
from millm.interp.grading import GradeSums
from millm.interp.sae import SAE
from millm.interp.sae_files import SAEInfo, content_id
from millm.interp.steering import Attached
from millm.kernel.books.transcoders import Registered
from millm.kernel.model.beside import Beside
from millm.kernel.runtime.blocking import call_blocking
from millm.kernel.runtime.jobs import JobCancelled, JobHandle
from millm.lab.dictionaries.corpus import OpenedCorpus
from millm.lab.dictionaries.parts import DictionaryParts
from millm.lab.dictionaries.protocol import GradeRequest
from millm.lab.dictionaries.steps import mlp_engine
from millm.lab.discovery.reads import SKIPPED_POSITIONS
from millm.store.database import Store
from millm.store.dictionaries import grade_cards, insert_grade, keep_grade

SHORTEST = SKIPPED_POSITIONS + 2  # a window needs a read position and a next token after it
SHIPPED_GRADE = "grade.json"  # a grade card shipped beside an SAE's weights (the demo's)
CARD_KEYS = ("id", "sae_id", "model", "created_at", "figures")
SET_CARD_KEYS = ("id", "transcoder_set_id", "model", "created_at", "figures")


def shipped_card(folder: Path, keys: tuple[str, ...]) -> dict | None:
    """The grade card a folder ships (`grade.json`), when it reads as one with these keys."""
    try:
        card = json.loads((folder / SHIPPED_GRADE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return card if isinstance(card, dict) and all(key in card for key in keys) else None


def shipped_grade(info: SAEInfo) -> dict | None:
    """The grade card an SAE's folder ships, when it is one of this very SAE (its id is the
    weights' content id: a card of other weights is not shown); None otherwise."""
    folder = Path(info.path)
    card = shipped_card(folder if folder.is_dir() else folder.parent, CARD_KEYS)
    return card if card is not None and card["sae_id"] == info.id else None


def shipped_set_grade(registered: Registered, kept: set[str]) -> dict | None:
    """The grade card a transcoder set's folder ships, when it is one of these very weights (its
    `weights_id`, the content id of the set's files in block order), as a card of this set (a
    set's id names its path, which differs from checkout to checkout, so the card's id names
    both); None otherwise, or when its card is `kept` already (the files are hashed only then)."""
    card = shipped_card(registered.path, (*SET_CARD_KEYS, "weights_id"))
    if card is None or f"{card['id']}_{registered.id}" in kept:
        return None
    files = registered.transcoders.files
    try:
        weights = content_id(*(files[block] for block in sorted(files)))
    except OSError:  # a file gone since the set was read: no card of its weights to show
        return None
    if card["weights_id"] != weights:
        return None
    card = {key: value for key, value in card.items() if key != "sae_id"}
    return {**card, "id": f"{card['id']}_{registered.id}", "transcoder_set_id": registered.id}


def kept_cards(
    store: Store, dictionary_id: str, shipped: Callable[[set[str]], dict | None]
) -> list[dict]:
    """A dictionary's grade cards, newest first; the card its folder ships (`grade.json`: the
    demo's; `shipped` is given the ids kept already) is kept among them the first time they are
    read."""
    cards = grade_cards(store, dictionary_id)
    card = shipped({kept["id"] for kept in cards})
    if card is not None and all(kept["id"] != card["id"] for kept in cards):
        keep_grade(store, card)
        cards = grade_cards(store, dictionary_id)
    return cards


def logits_under(lm: LoadedModel, ids: list[int], edit: ResidualEdit | None) -> torch.Tensor:
    """Next-token logits `[len - 2, V]` at positions 1.. (predicting ids[2:]) under `edit`."""
    if edit is not None:
        lm.residual.install(lm.residual.stack([edit]))
    try:
        return lm.runner.prompt_logits(ids, SKIPPED_POSITIONS + 1).float().cpu()
    finally:
        lm.residual.clear()


def grade_window(lm: LoadedModel, attached: Attached, ids: list[int], sums: GradeSums) -> None:
    """One window's three passes, added to `sums` (on the scheduler thread)."""
    sae = attached.sae
    seen: dict[str, torch.Tensor] = {}

    counted = slice(SKIPPED_POSITIONS, len(ids) - 1)  # the positions whose next token is scored

    def splice(residual: torch.Tensor) -> torch.Tensor:
        # a copy: the engine writes the returned residual back over the one it passed in
        x = residual[SKIPPED_POSITIONS:].float().clone()
        latents = sae.encode(x)
        reconstruction = sae.decode(latents, x)
        # Some engines (llama.cpp) never run the last position, whose logits no score needs: the
        # figures count the positions every engine runs, those whose next token is scored.
        rows = slice(0, counted.stop - counted.start)
        seen.update(x=x[rows].cpu(), reconstruction=reconstruction[rows].cpu(),
                    latents=latents[rows].cpu())  # fmt: skip
        out = residual.clone()
        out[SKIPPED_POSITIONS:] = reconstruction.to(residual.dtype)
        return out

    def zero(residual: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(residual)

    point = attached.point
    clean = logits_under(lm, ids, None)
    spliced = logits_under(lm, ids, ResidualEdit((), ((point, splice),)))
    zeroed = logits_under(lm, ids, ResidualEdit((), ((point, zero),)))
    sums.add_reconstruction(seen["x"], seen["reconstruction"], seen["latents"])
    targets = torch.tensor(ids[SKIPPED_POSITIONS + 1 :])
    sums.add_logits(targets, clean, spliced, zeroed)


def transcoded(
    sae: SAE, skip: torch.Tensor | None, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A transcoder's latents and its prediction of the MLP output at inputs x (its skip
    connection `[d_out, d_in]` added as x @ skip.T)."""
    latents = sae.encode(x)
    out = sae.decode(latents, x)
    return latents, out if skip is None else out + x @ skip.T.to(x.dtype)


def grade_transcoder_window(
    lm: LoadedModel, attached: Attached, model: ReplacementModel, ids: list[int], sums: GradeSums
) -> None:
    """One window's three passes for a transcoder, added to `sums` (on the scheduler thread): its
    output in place of its block's MLP output (positions 1..), and the MLP removed (all)."""
    sae, block = attached.sae, model.layout.blocks[attached.layer]
    seen: dict[str, torch.Tensor] = {}
    counted = len(ids) - 1 - SKIPPED_POSITIONS  # positions whose next token is scored

    def splice(residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x[SKIPPED_POSITIONS:].float()
        target = model.mlp(block, x)
        # the transcoder where it is attached (the served model's device: a copy read on
        # llama.cpp's behalf may lie elsewhere)
        at = x.to(sae.W_enc.device)
        latents, predicted = transcoded(sae, sae.W_skip, at)
        predicted = predicted.to(x.device)
        seen.update(x=target[:counted].cpu(), reconstruction=predicted[:counted].cpu(),
                    latents=latents[:counted].cpu())  # fmt: skip
        out = residual.clone()
        out[SKIPPED_POSITIONS:] += (predicted - target).to(residual.dtype)
        return out

    def zero(residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return residual - model.mlp(block, x.float()).to(residual.dtype)

    def at(apply) -> ResidualEdit:
        read = mlp_input(attached.layer)
        return ResidualEdit((), ((attached.point, SourcedOperation(read, apply, object())),))

    clean = logits_under(lm, ids, None)
    spliced = logits_under(lm, ids, at(splice))
    zeroed = logits_under(lm, ids, at(zero))
    sums.add_reconstruction(seen["x"], seen["reconstruction"], seen["latents"])
    sums.add_logits(torch.tensor(ids[SKIPPED_POSITIONS + 1 :]), clean, spliced, zeroed)


@dataclass
class GradeRun:
    """One grading job's work: call it with the job's handle."""

    state: DictionaryParts
    attached: Attached
    model: str
    corpus: OpenedCorpus
    body: GradeRequest

    def __call__(self, handle: JobHandle) -> dict:
        transcoder = self.attached.transcoder
        with mlp_engine(self.state.switch, self.model, transcoder) as engine:
            if not transcoder:
                return self._grade(handle, engine, grade_window)
            model = call_blocking(
                self.state.switch,
                engine,
                lambda lm: ReplacementModel(lm.runner.layout, frozen=False),
            )
            return self._grade(handle, engine, partial(grade_transcoder_window, model=model))

    def _grade(self, handle: JobHandle, engine: str | Beside, grade: Callable) -> dict:
        sums = GradeSums(self.attached.sae.d_sae)
        window = partial(grade, attached=self.attached, sums=sums)
        tokens = graded_windows(self.state, self.model, engine, self.corpus, self.body, handle,
                                window, lambda: sums.predicted)  # fmt: skip
        card = {
            "id": f"grade_{uuid.uuid4().hex[:12]}",
            "object": "dictionary_grade",
            "sae_id": self.attached.info.id,
            "model": self.model,
            "layer": self.attached.layer,
            "hook_point": self.attached.info.hook_point,
            "corpus": {**self.corpus.describe(), "part": self.body.part},
            "tokens": tokens,
            "created_at": time.time(),
            "figures": sums.card(),
        }
        insert_grade(self.state.store, card)
        return card


def graded_windows(
    state: DictionaryParts,
    model: str,
    engine: str | Beside,
    corpus: OpenedCorpus,
    body: GradeRequest,
    handle: JobHandle,
    grade: Callable,
    predicted: Callable[[], int],
) -> int:
    """Run `grade(lm, ids=...)` on the scheduler thread for each window the request grades, up to
    its token budget; the tokens graded. A 400 when the corpus gave no window (`predicted()`,
    the next tokens scored so far, is 0)."""
    lm = state.switch.lm
    if lm is None or lm.name != model:
        raise InvalidRequest(f"model {model!r} is no longer loaded")
    tokens, budget = 0, body.max_tokens
    for window in corpus.windows(lm.tokenizer, lm.context_length):
        if tokens >= budget:
            break
        if body.part == "held_out" and not window.held_out:
            continue
        ids = window.ids[: budget - tokens]
        if len(ids) < SHORTEST:
            continue
        handle.check()
        began = time.monotonic()
        answered = call_blocking(
            state.switch, engine, partial(grade, ids=ids), cancel=handle.cancel_event
        )
        if answered is None and handle.cancel_event.is_set():
            raise JobCancelled()
        tokens += len(ids)
        handle.advance(len(ids))
        handle.pace(time.monotonic() - began)
    handle.check()
    if predicted() == 0:
        raise InvalidRequest(
            "the corpus gave no window to grade on"
            + (" among the held-out ones (every 20th)" if body.part == "held_out" else ""),
            param="corpus",
        )
    return tokens
