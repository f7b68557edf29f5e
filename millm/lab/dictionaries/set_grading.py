"""Grading a registered transcoder set as a job: the replacement model (every block's MLP output
replaced by its transcoder's, no error terms) against the model itself and against the model with
every MLP zeroed, and each block's own figures on the clean model's MLP inputs.

Each window's three passes run on the scheduler thread as for one transcoder (grading.py): the
clean pass carries, at every block, an operation that leaves the residual as it is and adds the
block's reconstruction figures (its MLP output and the transcoder's prediction from the same
input), so each block is measured alone; the spliced pass replaces every MLP output at positions
1.., the zeroed pass removes every MLP output.
"""

from __future__ import annotations

import copy
import time
import uuid
from dataclasses import dataclass
from functools import partial

import torch

from millm.engine.loader import LoadedModel
from millm.engine.residual import ResidualEdit, SourcedOperation, mlp_input
from millm.interp.attribution.replacement import ReplacementModel
from millm.interp.grading import GradeSums
from millm.interp.sae import SAE
from millm.interp.transcoders import TranscoderSet
from millm.kernel.runtime.blocking import call_blocking
from millm.kernel.runtime.jobs import JobHandle
from millm.lab.dictionaries.corpus import OpenedCorpus
from millm.lab.dictionaries.grading import graded_windows, logits_under, transcoded
from millm.lab.dictionaries.parts import DictionaryParts
from millm.lab.dictionaries.protocol import GradeRequest
from millm.lab.dictionaries.steps import mlp_engine
from millm.lab.discovery.reads import SKIPPED_POSITIONS
from millm.store.dictionaries import insert_grade

RECONSTRUCTION = ("fraction_variance_explained", "mse", "l0", "dead_fraction", "dense_fraction")


@dataclass(frozen=True)
class OnDevice:
    """A set's transcoders and skip connections copied to the reading model's device (the
    registered set stays as it is, on the CPU), and that model's replacement model."""

    model: ReplacementModel
    layers: dict[int, SAE]
    skips: dict[int, torch.Tensor]

    @classmethod
    def of(cls, found: TranscoderSet, lm: LoadedModel) -> OnDevice:
        """Made on the scheduler thread of `lm`, the model the grade reads."""
        return cls(
            ReplacementModel(lm.runner.layout, frozen=False),  # type: ignore[attr-defined]
            {block: copy.copy(sae).to(lm.device) for block, sae in found.layers.items()},
            {block: skip.to(lm.device) for block, skip in found.skips.items()},
        )


def grade_set_window(
    lm: LoadedModel,
    found: OnDevice,
    ids: list[int],
    sums: GradeSums,
    blocks: dict[int, GradeSums],
) -> None:
    """One window's three passes over the whole set, added to `sums` (the model's figures) and
    `blocks` (each block's reconstruction), on the scheduler thread."""
    counted = len(ids) - 1 - SKIPPED_POSITIONS  # positions whose next token is scored
    model = found.model

    def observe(block: int, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x[SKIPPED_POSITIONS:].float()
        target = model.mlp(model.layout.blocks[block], x)
        latents, out = transcoded(found.layers[block], found.skips.get(block), x)
        blocks[block].add_reconstruction(
            target[:counted].cpu(), out[:counted].cpu(), latents[:counted].cpu()
        )
        return residual

    def splice(block: int, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = x[SKIPPED_POSITIONS:].float()
        target = model.mlp(model.layout.blocks[block], x)
        _, out = transcoded(found.layers[block], found.skips.get(block), x)
        spliced = residual.clone()
        spliced[SKIPPED_POSITIONS:] += (out - target).to(residual.dtype)
        return spliced

    def zero(block: int, residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return residual - model.mlp(model.layout.blocks[block], x.float()).to(residual.dtype)

    def everywhere(apply) -> ResidualEdit:
        operations = tuple(
            (block, SourcedOperation(mlp_input(block), partial(apply, block), object()))
            for block in sorted(found.layers)
        )
        return ResidualEdit((), operations)

    clean = logits_under(lm, ids, everywhere(observe))
    spliced = logits_under(lm, ids, everywhere(splice))
    zeroed = logits_under(lm, ids, everywhere(zero))
    sums.add_logits(torch.tensor(ids[SKIPPED_POSITIONS + 1 :]), clean, spliced, zeroed)


def set_card(sums: GradeSums, blocks: dict[int, GradeSums]) -> dict:
    """The set's figures: the replacement model's cross-entropy and KL, each block's
    reconstruction figures, and their means over the blocks."""
    figures = {k: v for k, v in sums.card().items() if k not in (*RECONSTRUCTION, "positions")}
    per_block = []
    for block, block_sums in sorted(blocks.items()):
        card = block_sums.card()
        per_block.append({"block": block, "positions": card["positions"],
                          **{key: card[key] for key in RECONSTRUCTION}})  # fmt: skip
    for key in RECONSTRUCTION:
        values = [entry[key] for entry in per_block if entry[key] is not None]
        figures[f"mean_{key}"] = sum(values) / len(values) if values else None
    return {**figures, "blocks": per_block}


@dataclass
class SetGradeRun:
    """One grading job of a transcoder set: call it with the job's handle."""

    state: DictionaryParts
    set_id: str
    found: TranscoderSet
    model: str
    corpus: OpenedCorpus
    body: GradeRequest

    def __call__(self, handle: JobHandle) -> dict:
        sums = GradeSums(self.found.d_transcoder)
        blocks = {block: GradeSums(sae.d_sae) for block, sae in self.found.layers.items()}
        with mlp_engine(self.state.switch, self.model, True) as engine:
            on = call_blocking(self.state.switch, engine, partial(OnDevice.of, self.found))
            window = partial(grade_set_window, found=on, sums=sums, blocks=blocks)
            tokens = graded_windows(self.state, self.model, engine, self.corpus, self.body,
                                    handle, window, lambda: sums.predicted)  # fmt: skip
        card = {
            "id": f"grade_{uuid.uuid4().hex[:12]}",
            "object": "dictionary_grade",
            "transcoder_set_id": self.set_id,
            "model": self.model,
            "hook_point": "mlp",
            "corpus": {**self.corpus.describe(), "part": self.body.part},
            "tokens": tokens,
            "created_at": time.time(),
            "figures": set_card(sums, blocks),
        }
        insert_grade(self.state.store, card)
        return card
