"""SAE decoders as numpy arrays, for decoder norms and nearest features by cosine.

The conversion from the SAE's torch weights runs once per SAE, on a passing thread (it needs
torch); what it keeps is numpy (row norms and unit rows, float32), which worker-pool threads may
use freely. An SAE id is a hash of its weights file, so a kept decoder never goes stale. At most
DECODERS_KEPT are kept, the least recently used going first (a 16k x 2304 decoder is 150 MB).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from millm.interp.sae import SAE
from millm.kernel.runtime.threads import in_passing_thread
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry

DECODERS_KEPT = 4


@dataclass(frozen=True)
class Decoder:
    """An SAE's decoder rows: their norms, and the rows scaled to unit norm (a zero row stays
    zero)."""

    norms: np.ndarray  # [d_sae] float32
    unit: np.ndarray  # [d_sae, d_in] float32


def decoder_of(sae: SAE) -> Decoder:
    """The SAE's W_dec as a Decoder (torch work: call it on a passing thread)."""
    rows = sae.W_dec.detach().to("cpu", torch.float32).numpy().copy()
    norms = np.linalg.norm(rows, axis=1).astype(np.float32)
    unit = np.divide(rows, norms[:, None], out=np.zeros_like(rows), where=norms[:, None] > 0)
    return Decoder(norms, unit)


def neighbours(decoder: Decoder, index: int | list[int], k: int) -> list[tuple[int, float]]:
    """The k features whose decoder rows are nearest feature `index`'s by cosine (itself left out),
    highest cosine first, ties by index; for a list of features, nearest the mean of their unit
    rows (the group's centroid, its members left out)."""
    members = [index] if isinstance(index, int) else list(index)
    centre = decoder.unit[index] if isinstance(index, int) else decoder.unit[members].mean(axis=0)
    length = float(np.linalg.norm(centre))
    if len(members) > 1 and length > 0:
        centre = centre / length
    cosines = decoder.unit @ centre
    cosines[members] = -np.inf
    k = min(k, len(cosines) - len(set(members)))
    if k <= 0:
        return []
    top = np.argpartition(-cosines, k - 1)[:k] if k < len(cosines) else np.arange(len(cosines))
    order = top[np.lexsort((top, -cosines[top]))]
    return [(int(i), float(cosines[i])) for i in order]


class DecoderCache:
    """The decoders of the last few SAEs asked about (bounded, least recently used first out)."""

    def __init__(self, steering: Steering, saes: SAERegistry, kept: int = DECODERS_KEPT):
        self.steering, self.saes, self.kept = steering, saes, kept
        self._lock = threading.Lock()
        self._decoders: OrderedDict[str, Decoder] = OrderedDict()

    def get(self, sae_id: str) -> Decoder | None:
        """The kept decoder of an SAE, if any."""
        with self._lock:
            decoder = self._decoders.get(sae_id)
            if decoder is not None:
                self._decoders.move_to_end(sae_id)
            return decoder

    def keep(self, sae_id: str, decoder: Decoder) -> Decoder:
        """Keep a decoder, dropping the least recently used past the bound."""
        with self._lock:
            self._decoders[sae_id] = decoder
            self._decoders.move_to_end(sae_id)
            while len(self._decoders) > self.kept:
                self._decoders.popitem(last=False)
        return decoder

    async def of(self, sae_id: str) -> Decoder:
        """The SAE's decoder, read into the cache first (on a passing thread) when it is not
        there."""
        return self.get(sae_id) or await in_passing_thread(self._load, sae_id)

    def _load(self, sae_id: str) -> Decoder:
        """From the SAE's attached copy, else from its file (torch: runs on a passing thread)."""
        with self.steering.lock:
            attached = self.steering.attached.get(sae_id)
        sae = attached.sae if attached is not None else self.saes.load(sae_id)
        return self.keep(sae_id, decoder_of(sae))

    def drop(self, sae_id: str) -> None:
        """Forget an SAE's decoder."""
        with self._lock:
            self._decoders.pop(sae_id, None)
