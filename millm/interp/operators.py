"""Steering operators beyond add: clamp, ablate and cap, as engine Operations over an attached SAE.

`add` (steering.py) pushes the residual by a constant vector. These read the residual at each
position and rewrite it (an Operation: `[T, d]` -> `[T, d]`, float32 inside, the residual's
dtype out), so each runs once per forward pass, after the point's additions:

- clamp(f, t): hold feature f's encoded activation at t. The residual moves along f's decoder
  row only, x' = x + c·W_dec[f], by the c that makes the pre-activation read t. The SAE is
  linear up to its activation, so pre_f(x + c·W_dec[f]) = pre_f(x) + c·g with
  g = W_enc[:, f]·W_dec[f], hence c = (t − pre_f(x)) / g (a constant input scale is folded into
  W_enc when the file is read, so g already carries it). For a unit-norm SAE whose encoder
  matches its decoder g = 1 and this is (t − a)·W_dec[f].
  Several features clamped on one SAE are held together: moving along W_dec[j] also moves
  pre_i by c_j·G[i, j] (G[i, j] = W_enc[:, i]·W_dec[j]), so c solves G_CC c = t_C − pre_C over
  the held set C, and every one of them reads its target after the edit, not just the last.
- ablate(f) = clamp(f, 0), with one rule: a position where f is already silent (its encoded
  activation is 0) is left as it is. Holding its pre-activation at 0 there would push a
  negative pre-activation up, changing the residual for a feature that was not there. A
  silent feature that another clamp of the same SAE would wake is held at 0 too. Where it is
  held, the pre-activation is held a float32 rounding margin below 0 (ROUNDING · |x|·|W_enc[:, f]|),
  so that re-encoding reads exactly 0 rather than a rounding error of 1e-7 through the ReLU.
- cap(u, v): the residual's component along the unit vector û may be at most v:
  x − max(0, x·û − v)·û. A feature's cap uses û = W_dec[f] / |W_dec[f]|.

A transcoder's features read its block's MLP input and write into the residual after the block,
so a push along W_dec[f] never changes what f reads: there is no system to solve. Its clamp
replaces f's write, x' = x + (t − a_f)·W_dec[f] with a_f its activation at the MLP input (read in
the same forward pass), and ablate removes it (− a_f·W_dec[f], nothing where f is silent), which
is how circuit-tracer intervenes on a transcoder feature. Nothing is re-encoded afterwards, so
neither the JumpReLU threshold nor the encoder's angle to the decoder limits a target.

What the clamp promise depends on, decided here once (`hold`) rather than discovered mid-row:
- JumpReLU: a feature reads 0 unless its pre-activation is above its threshold θ_f, so a
  target 0 < t <= θ_f can never be read back: refused (400 naming the feature and θ_f).
- TopK: the pre-activation is held at t at every position; the encoded activation reads t
  where f is among the k largest pre-activations after the edit and 0 where it is not (which
  depends on the residual, so it is not refused; a target above the position's k-th largest
  other pre-activation always survives). Ablate holds exactly: a held pre-activation of 0
  reads 0 whether or not it ranks.
- Input normalisation per position (constant_norm_rescale, layer_norm) makes pre_f non-linear
  in the residual, so no single step along W_dec[f] is known to reach t: refused for clamp
  and ablate (cap reads no encoder and works on any SAE).
- A feature whose encoder column is nearly orthogonal to its decoder row (|cosine| below
  HOLD_COSINE_MIN, or a held set whose cosine matrix is that close to singular) would need an
  enormous push along the decoder to move its pre-activation: refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import torch

from millm.engine.prefix_cache import digest, keyed
from millm.engine.residual import Operation, SourcedOperation
from millm.errors import InvalidRequest
from millm.interp.sae import SAE, JumpReLUSAE, TopKSAE

# Below this |cosine| between a feature's encoder column and decoder row (or smallest singular
# value of a held set's cosine matrix), holding it costs more than 20x the push along the decoder
# that a matched feature needs, and float32 rounding of the pre-activation grows with it.
HOLD_COSINE_MIN = 0.05
# Features clamped or ablated together on one SAE: every subset the ablate rule may hold at a
# position is checked for conditioning when the operation is built (2^n small matrices).
MAX_HELD = 12
# A bound on float32 rounding in a pre-activation x·W_enc[:, f], relative to |x|·|W_enc[:, f]| (64
# ulps): an ablated feature is held this far below 0, so it reads 0 however the dot product rounds.
ROUNDING = 64 * torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class Held:
    """One feature to hold: its index and target activation (0: ablate, only where it fires)."""

    index: int
    target: float


def _refuse(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="operator_not_applicable")


def check_holdable(sae: SAE, sae_id: str, held: list[Held], param: str) -> None:
    """400 operator_not_applicable when clamping these features could not read back their targets
    (see the module docstring)."""
    if not held:
        return
    if sae.normalize_activations != "none":
        raise _refuse(
            f"{sae_id} normalises its input per position ({sae.normalize_activations}), so a "
            "clamp or ablation cannot be held exactly; use add or cap on it",
            param,
        )
    if len(held) > MAX_HELD:
        raise _refuse(
            f"{len(held)} features of {sae_id} are clamped or ablated; at most {MAX_HELD} may be "
            "held on one SAE",
            param,
        )
    if isinstance(sae, JumpReLUSAE):
        for h in held:
            threshold = float(sae.threshold[h.index])
            if 0 < h.target <= threshold:
                raise _refuse(
                    f"feature {h.index} of {sae_id} (JumpReLU) reads 0 unless its pre-activation "
                    f"is above its threshold {threshold:.6g}, so a clamp at {h.target:g} can "
                    f"never be read back; clamp it above {threshold:.6g}, or ablate it",
                    param,
                )
    cosines = _cosines(sae, [h.index for h in held])
    for h, cosine in zip(held, cosines.diagonal().tolist(), strict=True):
        if (
            not abs(cosine) >= HOLD_COSINE_MIN
        ):  # NaN too: a zero row (a dead feature) has no direction
            raise _refuse(
                f"feature {h.index} of {sae_id} has an encoder nearly orthogonal to its decoder "
                f"(cosine {cosine:.3g}): holding its activation would need a push out of all "
                "proportion; use add or cap on it",
                param,
            )
    _check_subsets(sae_id, held, cosines, param)


def _cosines(sae: SAE, indices: list[int]) -> torch.Tensor:
    """K[i, j] = cos(W_enc[:, f_i], W_dec[f_j]): the held set's coupling, free of the SAE's
    scale."""
    encoders = sae.W_enc[:, indices].float().T
    decoders = sae.W_dec[indices].float()
    coupling = encoders @ decoders.T
    return coupling / (encoders.norm(dim=1)[:, None] * decoders.norm(dim=1)[None, :])


def _check_subsets(sae_id: str, held: list[Held], cosines: torch.Tensor, param: str) -> None:
    """Every set a position may hold (all positive targets, and any of the ablated ones) must be
    well conditioned."""
    always = [i for i, h in enumerate(held) if h.target > 0]
    maybe = [i for i, h in enumerate(held) if h.target == 0]
    for size in range(len(maybe) + 1):
        for extra in combinations(maybe, size):
            chosen = always + list(extra)
            if len(chosen) < 2:
                continue  # single features were checked above
            smallest = float(torch.linalg.svdvals(cosines[chosen][:, chosen]).min())
            if not smallest >= HOLD_COSINE_MIN:
                names = ", ".join(str(held[i].index) for i in chosen)
                raise _refuse(
                    f"features {names} of {sae_id} cannot be held together: their encoders and "
                    f"decoders are nearly dependent (smallest singular value {smallest:.3g}); "
                    "hold fewer of them at once",
                    param,
                )


def hold(sae: SAE, sae_id: str, held: list[Held], param: str = "steering") -> Operation:
    """The Operation clamping (target > 0) and ablating (target 0) these features of one SAE
    together; refused per check_holdable."""
    check_holdable(sae, sae_id, held, param)
    indices = [h.index for h in held]
    w_enc = sae.W_enc[:, indices].float()  # [d, k]
    b_enc = sae.b_enc[indices].float()
    w_dec = sae.W_dec[indices].float()  # [k, d]
    b_dec = sae.b_dec.float() if sae.apply_b_dec_to_input else None
    coupling = w_enc.T @ w_dec.T  # G[i, j] = W_enc[:, i]·W_dec[j]
    targets = torch.tensor([h.target for h in held], dtype=torch.float32, device=w_enc.device)
    always = targets > 0
    ablated = ~always
    encoder_norms = w_enc.norm(dim=0)
    eye = torch.eye(len(held), dtype=torch.float32, device=w_enc.device)
    silent = _silence(sae, indices)

    def pre_of(x: torch.Tensor) -> torch.Tensor:
        # As SAE.pre_activation computes it, for the held columns only (normalisation is none here).
        return (x if b_dec is None else x - b_dec) @ w_enc + b_enc

    if not bool(ablated.any()):
        # Every feature is held at every position: one system for all of them, inverted once here.
        inverse_t = torch.linalg.inv(coupling).T

        def hold_all(residual: torch.Tensor) -> torch.Tensor:
            x = residual.float()
            push = (targets - pre_of(x)) @ inverse_t
            return (x + push @ w_dec).to(residual.dtype)

        return keyed(hold_all, ("hold", sae_id, tuple(held)))

    def operation(residual: torch.Tensor) -> torch.Tensor:
        x = residual.float()
        pre = pre_of(x)
        held_now = always | (ablated & ~silent(x, pre))
        # [T, k]
        aims = torch.where(
            ablated, -ROUNDING * x.norm(dim=1, keepdim=True) * encoder_norms, targets
        )
        edited = x
        for _ in range(len(held) + 1):  # each round may only add ablated features, so this ends
            rows = held_now[:, :, None]
            system = torch.where(rows, coupling, eye)
            wanted = torch.where(held_now, aims - pre, torch.zeros_like(pre))
            push = torch.linalg.solve(system, wanted) * held_now
            edited = x + push @ w_dec
            woken = ablated & ~held_now & ~silent(edited, pre_of(edited))
            if not bool(woken.any()):
                break
            held_now = held_now | woken
        return edited.to(residual.dtype)

    # An SAE's id is its file's content hash: the same id and holds are the same operation.
    return keyed(operation, ("hold", sae_id, tuple(held)))


def _activations(sae: SAE, indices: list[int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """x `[T, d]` -> `[T, k]` the encoded activations of these features (float32)."""
    index = torch.tensor(indices, dtype=torch.long, device=sae.W_enc.device)
    if isinstance(sae, TopKSAE) or sae.normalize_activations != "none":
        return lambda x: sae.encode(x)[:, index]  # a feature's value depends on the others
    w_enc, b_enc = sae.W_enc[:, index].float(), sae.b_enc[index].float()
    b_dec = sae.b_dec.float() if sae.apply_b_dec_to_input else None
    threshold = sae.threshold[index].float() if isinstance(sae, JumpReLUSAE) else None

    def activations(x: torch.Tensor) -> torch.Tensor:
        pre = (x if b_dec is None else x - b_dec) @ w_enc + b_enc
        return torch.relu(pre) if threshold is None else torch.relu(pre) * (pre > threshold)

    return activations


def transcoder_hold(
    sae: SAE, sae_id: str, held: list[Held], source: int, reach: int = 0
) -> SourcedOperation:
    """The operation replacing these transcoder features' writes by their targets (0: ablate), their
    activations read at `source` (the block's MLP input) in the same forward pass; `reach`: which
    of a cross-layer transcoder's writes (into the MLP output that many blocks on)."""
    indices = [h.index for h in held]
    activations = _activations(sae, indices)
    index = torch.tensor(indices, dtype=torch.long, device=sae.W_dec.device)
    w_dec = sae.writes(index)[:, reach].float()  # [k, d]
    targets = torch.tensor([h.target for h in held], dtype=torch.float32, device=w_dec.device)
    ablated = targets == 0

    def apply(residual: torch.Tensor, mlp_input: torch.Tensor) -> torch.Tensor:
        now = activations(mlp_input.float())  # [T, k]
        push = torch.where(ablated, -now, targets - now)
        return (residual.float() + push @ w_dec).to(residual.dtype)

    return SourcedOperation(source, apply, ("transcoder hold", sae_id, tuple(held), reach))


def _silence(sae: SAE, indices: list[int]) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """(x, pre of the held columns) -> [T, k] whether each held feature's encoded activation is 0
    there."""
    if isinstance(sae, TopKSAE):
        # Whether a feature survives the top-k depends on every other feature: encode in full.
        index = torch.tensor(indices, device=sae.W_enc.device)
        return lambda x, pre: sae.encode(x)[:, index] <= 0
    if isinstance(sae, JumpReLUSAE):
        threshold = sae.threshold[indices].float()
        return lambda x, pre: ~((pre > 0) & (pre > threshold))
    return lambda x, pre: pre <= 0


def cap(
    direction: torch.Tensor, value: float, what: str = "the direction", param: str = "steering"
) -> Operation:
    """The Operation limiting the residual's component along `direction` (made unit) to at most
    `value`."""
    norm = float(direction.float().norm())
    if not norm > 0:
        raise _refuse(f"{what} is a zero vector: there is no component to cap", param)
    unit = direction.float() / norm

    def operation(residual: torch.Tensor) -> torch.Tensor:
        x = residual.float()
        excess = torch.relu(x @ unit - value)
        return (x - excess[:, None] * unit).to(residual.dtype)

    return keyed(operation, ("cap", digest(unit), value))


def feature_cap(
    sae: SAE, sae_id: str, index: int, value: float, param: str = "steering"
) -> Operation:
    """cap along feature `index`'s unit decoder row."""
    return cap(sae.W_dec[index], value, f"the decoder row of feature {index} of {sae_id}", param)
