"""Sparse autoencoders: one class per architecture, each encoding exactly as it was trained.

    pre = (norm_in(x) - b_dec * [apply_b_dec_to_input]) @ W_enc + b_enc
    standard: f = ReLU(pre)
    jumprelu: f = ReLU(pre) * (pre > threshold)     (Gemma Scope and SAELens both keep the ReLU)
    topk:     f = the k largest of pre, through ReLU, zeros elsewhere
    decode:   norm_out(f @ W_dec + b_dec)

`norm_in` / `norm_out` are SAELens' run-time activation normalisations: `none`,
`constant_norm_rescale` (x * sqrt(d_in) / |x|, undone on the way out) and `layer_norm`
(subtract the mean, divide by the standard deviation, undone on the way out). Steering only
uses W_dec rows; reading activations uses `encode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NORMALISATIONS = ("none", "constant_norm_rescale", "layer_norm")
LN_EPS = 1e-5


@dataclass
class SAEWeights:
    """The tensors every architecture shares (float32, on the CPU until placed)."""

    W_enc: torch.Tensor  # [d_in, d_sae]
    b_enc: torch.Tensor  # [d_sae]
    W_dec: torch.Tensor  # [d_sae, d_in]
    b_dec: torch.Tensor  # [d_in]


class SAE:
    """Base class: shared pre-activation, decode and normalisation; subclasses define the
    activation."""

    architecture = "standard"
    # A transcoder's skip connection `[d_out, d_in]` (x @ W_skip.T joins its output); SAEs have
    # none.
    W_skip: torch.Tensor | None = None
    # A cross-layer transcoder block's whole decoder `[d_sae, K, d_in]`: slice k is written into
    # the MLP output k blocks on (slice 0 is W_dec); SAEs and one-block transcoders have none.
    cross: torch.Tensor | None = None

    def __init__(
        self,
        weights: SAEWeights,
        apply_b_dec_to_input: bool = True,
        normalize_activations: str = "none",
    ):
        self.W_enc, self.b_enc, self.W_dec, self.b_dec = (
            weights.W_enc,
            weights.b_enc,
            weights.W_dec,
            weights.b_dec,
        )
        self.apply_b_dec_to_input = apply_b_dec_to_input
        if normalize_activations not in NORMALISATIONS:
            raise ValueError(
                f"normalize_activations {normalize_activations!r} is not one of {NORMALISATIONS}"
            )
        self.normalize_activations = normalize_activations

    @property
    def d_in(self) -> int:
        """Width of the residual stream it reads."""
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        """Number of features."""
        return int(self.W_enc.shape[1])

    @property
    def reach(self) -> int:
        """How many blocks its features write into, from its own on (a cross-layer block:
        several)."""
        return 1 if self.cross is None else int(self.cross.shape[1])

    def writes(self, indices: torch.Tensor) -> torch.Tensor:
        """These features' writes `[n, reach, d_in]` per unit of activation (slice k: k blocks
        on)."""
        return self.W_dec[indices][:, None] if self.cross is None else self.cross[indices]

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> SAE:
        """Move every tensor (in place); returns self."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device=device, dtype=dtype))
        return self

    def _norm_in(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        if self.normalize_activations == "constant_norm_rescale":
            coeff = (self.d_in**0.5) / x.norm(dim=-1, keepdim=True)
            return x * coeff, (coeff,)
        if self.normalize_activations == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            centred = x - mu
            std = centred.std(dim=-1, keepdim=True)
            return centred / (std + LN_EPS), (mu, std)
        return x, ()

    def _norm_out(self, x: torch.Tensor, state: tuple) -> torch.Tensor:
        if self.normalize_activations == "constant_norm_rescale":
            return x / state[0]
        if self.normalize_activations == "layer_norm":
            return x * state[1] + state[0]
        return x

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder pre-activations `[..., d_sae]` for inputs `[..., d_in]` (float32)."""
        x, _ = self._norm_in(x.to(self.W_enc.dtype))
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The architecture's activation function."""
        return torch.relu(pre)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations `[..., d_sae]`."""
        return self.activate(self.pre_activation(x))

    def encode_features(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The activations `[..., m]` of the features `index` `[m]` alone: exactly their columns of
        `encode(x)`, computed from their encoder columns only (an elementwise activation needs no
        other feature)."""
        x, _ = self._norm_in(x.to(self.W_enc.dtype))
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return self.activate_columns(x @ self.W_enc[:, index] + self.b_enc[index], index)

    def activate_columns(self, pre: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The activation function over the pre-activations of the features `index`."""
        return torch.relu(pre)

    def decode(self, features: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """Reconstruction `[..., d_in]`; run-time normalisations need the input `x` they were
        computed on."""
        out = features @ self.W_dec + self.b_dec
        if self.normalize_activations == "none":
            return out
        if x is None:
            raise ValueError(
                f"decode needs the input x for normalize_activations={self.normalize_activations}"
            )
        _, state = self._norm_in(x.to(self.W_enc.dtype))
        return self._norm_out(out, state)

    def output_scale(self, x: torch.Tensor) -> torch.Tensor:
        """`[..., 1]`: what decode multiplies a feature's W_dec row by at inputs x (1 unless a
        run-time normalisation is undone on the way out)."""
        _, state = self._norm_in(x.to(self.W_enc.dtype))
        if self.normalize_activations == "constant_norm_rescale":
            return 1 / state[0]
        if self.normalize_activations == "layer_norm":
            return state[1]
        return torch.ones(*x.shape[:-1], 1, dtype=self.W_enc.dtype, device=x.device)

    def direction(self, strengths: dict[int, float]) -> torch.Tensor:
        """Σ s_i · W_dec[i]: the residual delta that steering adds (float32, `[d_in]`)."""
        if not strengths:
            return torch.zeros(self.d_in, dtype=self.W_dec.dtype, device=self.W_dec.device)
        index = torch.tensor(list(strengths), dtype=torch.long, device=self.W_dec.device)
        values = torch.tensor(
            list(strengths.values()), dtype=self.W_dec.dtype, device=self.W_dec.device
        )
        return values @ self.W_dec[index]


class StandardSAE(SAE):
    """ReLU SAE (SAELens `standard` / `relu`)."""

    architecture = "standard"


class JumpReLUSAE(SAE):
    """JumpReLU SAE: a feature fires only above its learned threshold."""

    architecture = "jumprelu"

    def __init__(self, weights: SAEWeights, threshold: torch.Tensor, **kwargs):
        super().__init__(weights, **kwargs)
        self.threshold = threshold

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre) * (pre > self.threshold)

    def activate_columns(self, pre: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return torch.relu(pre) * (pre > self.threshold[index])


class TopKSAE(SAE):
    """TopK SAE: the k largest pre-activations (through ReLU) per position, zeros elsewhere."""

    architecture = "topk"

    def __init__(self, weights: SAEWeights, k: int, **kwargs):
        super().__init__(weights, **kwargs)
        self.k = k

    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        top = torch.topk(pre, k=min(self.k, pre.shape[-1]), dim=-1)
        return torch.zeros_like(pre).scatter_(-1, top.indices, torch.relu(top.values))

    def encode_features(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        # whether a feature is among the k largest depends on every other feature's
        return self.encode(x)[..., index]
