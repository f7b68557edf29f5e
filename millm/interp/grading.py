"""A dictionary's grade: SAEBench's core metrics, summed text by text and read as a card.

- Reconstruction: the fraction of variance explained, 1 - E‖x - x̂‖² / Var(x) over every graded
  position (SAELens's `ExplainedVarianceCalculator`, the one SAEBench's core eval uses), and the
  mean squared error.
- Sparsity: L0 (latents active per position), the fraction of latents that never fired (dead) and
  of those firing on more than DENSE_FREQUENCY of positions (dense).
- Downstream: the next-token cross-entropy of the clean model, of the model with the dictionary's
  reconstruction spliced in at its point, and with that point zeroed; CE loss recovered is
  (CE_zero - CE_spliced) / (CE_zero - CE_clean), and the KL divergence from the clean next-token
  distribution to the spliced one (and the zeroed one, whose ratio gives SAELens's KL score).

As in SAEBench (SAELens's `get_recons_loss` with its special tokens left out), position 0 of every
text, the attention sink whose residual is tens of times the others' norm, is neither spliced nor
counted; zero ablation zeroes every position. Every figure counts the same positions, those whose
next token is scored (1 .. T-2: llama.cpp never runs the last one). Sums are float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sae_lens.evals import ExplainedVarianceCalculator

DENSE_FREQUENCY = 0.1  # a latent firing on more than this fraction of positions is dense
MODES = ("clean", "spliced", "zeroed")  # the three passes of every graded text
CHUNK = 128  # positions whose distributions are compared at once (float64: 8 bytes x vocabulary)


def variance_calculator() -> ExplainedVarianceCalculator:
    """SAELens's variance sums (imported here: SAELens's import takes seconds, which a server's
    start should not pay)."""
    from sae_lens.evals import ExplainedVarianceCalculator

    return ExplainedVarianceCalculator()


@dataclass
class GradeSums:
    """Running sums over the graded texts."""

    d_sae: int
    variance: ExplainedVarianceCalculator = field(default_factory=variance_calculator)
    positions: int = 0
    active: float = 0.0  # Σ latents active per position
    squared_error: float = 0.0
    fired: torch.Tensor = field(init=False)  # per latent: positions it fired on
    predicted: int = 0  # next tokens scored
    ce: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MODES, 0.0))
    kl: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MODES[1:], 0.0))
    texts: int = 0

    def __post_init__(self) -> None:
        self.fired = torch.zeros(self.d_sae, dtype=torch.float64)

    def add_reconstruction(
        self, x: torch.Tensor, reconstruction: torch.Tensor, latents: torch.Tensor
    ) -> None:
        """One text's positions (sink left out): inputs, reconstructions `[n, d]` and latents
        `[n, d_sae]`."""
        x, reconstruction = x.float(), reconstruction.float()
        self.variance.add_batch(reconstruction, x)
        self.positions += len(x)
        firing = latents != 0
        self.active += float(firing.sum())
        self.fired += firing.sum(0).to(torch.float64)
        self.squared_error += float((x.double() - reconstruction.double()).pow(2).sum())

    def add_logits(
        self,
        targets: torch.Tensor,
        clean: torch.Tensor,
        spliced: torch.Tensor,
        zeroed: torch.Tensor,
    ) -> None:
        """One text's next-token logits `[n, V]` at the counted positions, and the tokens that
        came next `[n]`."""
        for start in range(0, len(targets), CHUNK):  # float64 copies of a chunk at a time
            rows = slice(start, start + CHUNK)
            logs = {
                mode: torch.log_softmax(logits[rows].double(), -1)
                for mode, logits in zip(MODES, (clean, spliced, zeroed), strict=True)
            }
            for mode, log_p in logs.items():
                self.ce[mode] -= float(log_p.gather(-1, targets[rows, None]).sum())
            p_clean = logs["clean"].exp()
            for mode in MODES[1:]:
                self.kl[mode] += float((p_clean * (logs["clean"] - logs[mode])).sum())
        self.predicted += len(targets)
        self.texts += 1

    def card(self) -> dict:
        """The figures (None where nothing was counted)."""
        n, t = self.positions, self.predicted
        frequency = self.fired / max(n, 1)
        ce = {mode: self.ce[mode] / t for mode in MODES} if t else {}
        kl = {mode: self.kl[mode] / t for mode in MODES[1:]} if t else {}
        recovered = None
        if ce and ce["zeroed"] != ce["clean"]:
            recovered = (ce["zeroed"] - ce["spliced"]) / (ce["zeroed"] - ce["clean"])
        return {
            "texts": self.texts,
            "positions": n,
            "fraction_variance_explained": self.variance.compute() if n else None,
            "mse": self.squared_error / n if n else None,
            "l0": self.active / n if n else None,
            "dead_fraction": float((self.fired == 0).double().mean()) if n else None,
            "dense_fraction": float((frequency > DENSE_FREQUENCY).double().mean()) if n else None,
            "ce_loss_clean": ce.get("clean"),
            "ce_loss_spliced": ce.get("spliced"),
            "ce_loss_zero_ablated": ce.get("zeroed"),
            "ce_loss_recovered": recovered,
            "kl_spliced": kl.get("spliced"),
            "kl_zero_ablated": kl.get("zeroed"),
            "kl_score": 1 - kl["spliced"] / kl["zeroed"] if kl and kl["zeroed"] > 0 else None,
        }
