"""POST /api/lens: the logit lens on the held model, steered or not.

One pass over the prompt (unsteered unless `steering` asks, in the vocabulary of inspect), read
after each chosen block; the lens table is made on the scheduler thread (engine/lens.py) and said
here with token strings. Refused before any pass: a model on llama.cpp (which keeps the final norm
and output head the lens runs), a block past the model's depth, a family whose final norm millm does
not know, and a table past MAX_LENS_CELLS (blocks x positions).
"""

from __future__ import annotations

from millm.engine.lens import LensTable
from millm.engine.loader import LoadedModel
from millm.errors import InvalidRequest
from millm.lab.discovery.inputs import (
    ReadSteering,
)
from millm.lab.discovery.inspection import token_strings
from millm.lab.discovery.lens_protocol import (
    LensCell,
    LensPosition,
    LensRequest,
    LensResponse,
    LensToken,
)
from millm.lab.discovery.protocol import SteeringUsed, TokenRead

MAX_LENS_CELLS = 50_000  # blocks x positions in one answer, each with its top-k


def chosen_layers(lm: LoadedModel, body: LensRequest, positions: int) -> list[int]:
    """The blocks to read (400 naming `layers[i]` past the model's depth, or the table past its
    cap)."""
    depth = int(lm.config.num_hidden_layers)
    layers = sorted(set(body.layers)) if body.layers is not None else list(range(depth))
    for i, layer in enumerate(body.layers or []):
        if layer >= depth:
            raise InvalidRequest(
                f"{lm.name} has blocks 0..{depth - 1}; layers[{i}] is {layer}", param=f"layers[{i}]"
            )
    shown = 1 if body.positions == "last" else positions
    if len(layers) * shown > MAX_LENS_CELLS:
        raise InvalidRequest(
            f"the lens would have {len(layers) * shown} cells ({len(layers)} blocks x {shown} "
            f"positions); at most {MAX_LENS_CELLS}: choose fewer layers, positions: last, or a "
            "shorter text",
            param="layers",
        )
    return layers


def lens_answer(
    lm: LoadedModel, prompt: list[int], table: LensTable, body: LensRequest, steered: ReadSteering
) -> LensResponse:
    """The table said with token strings (blocking: decoding)."""
    vocabulary = sorted(
        {i for layer in table.top_ids for row in layer for i in row}
        | set(table.final_ids)
        | set(prompt)
    )
    said = dict(zip(vocabulary, token_strings(lm, vocabulary), strict=True))
    shown = range(len(prompt) - 1, len(prompt)) if body.positions == "last" else range(len(prompt))
    predictions = []
    for p in shown:
        final = table.final_ids[p]
        cells = [
            LensCell(
                layer=layer,
                top=[
                    LensToken(token_id=i, token=said[i], probability=round(q, 6))
                    for i, q in zip(table.top_ids[row][p], table.top_probs[row][p], strict=True)
                ],
                final_probability=round(table.final_probs[row][p], 6),
            )
            for row, layer in enumerate(table.layers)
        ]
        predictions.append(
            LensPosition(
                position=p,
                final=LensToken(
                    token_id=final, token=said[final], probability=round(table.final_prob[p], 6)
                ),
                layers=cells,
            )
        )
    return LensResponse(
        model=lm.name,
        steered=steered.edit is not None,
        steering=SteeringUsed(kind=steered.kind, params=steered.params),
        layers=list(table.layers),
        tokens=[TokenRead(position=p, token_id=t, token=said[t]) for p, t in enumerate(prompt)],
        predictions=predictions,
    )
