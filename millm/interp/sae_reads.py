"""An SAE's features read from captured residuals: encoded in chunks with the SAE's own
activation, and each position's strongest features kept (what a request's read and
monitoring report)."""

from __future__ import annotations

import torch

ENCODE_CHUNK = 256  # positions encoded at once: bounds the [chunk, d_sae] intermediate


def top_features(
    activations: torch.Tensor, features: tuple[int, ...] | None, top_k: int
) -> list[list[dict]]:
    """Per position, the top_k largest activations among the candidates.

    Without `features`, inactive features (value 0) are left out; with them, every listed
    feature competes, so a requested feature that did not fire is reported with 0.
    """
    if features is not None:
        index = torch.tensor(features, dtype=torch.long)
        values = activations[:, index]
    else:
        index, values = None, activations
    k = min(top_k, values.shape[-1])
    top = torch.topk(values, k, dim=-1)
    rows = []
    for value_row, slot_row in zip(top.values.tolist(), top.indices.tolist(), strict=True):
        entries = []
        for value, slot in zip(value_row, slot_row, strict=True):
            if features is None and value <= 0.0:
                continue
            entries.append(
                {
                    "index": int(index[slot]) if index is not None else int(slot),
                    "value": float(value),
                }
            )
        rows.append(entries)
    return rows


def encode_rows(
    sae, residuals: torch.Tensor, features: tuple[int, ...] | None, top_k: int
) -> list[list[dict]]:
    """Encode captured residuals `[n, d]` with the SAE's own activation, in chunks, keeping the
    top features of each position (`features == ()`: none, only the positions)."""
    out: list[list[dict]] = []
    if features == ():
        return [[] for _ in range(residuals.shape[0])]
    with torch.inference_mode():
        for start in range(0, residuals.shape[0], ENCODE_CHUNK):
            chunk = residuals[start : start + ENCODE_CHUNK].to(sae.W_enc.device)
            out.extend(top_features(sae.encode(chunk).float().cpu(), features, top_k))
    return out
