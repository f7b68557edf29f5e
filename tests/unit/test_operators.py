"""clamp, ablate and cap on residuals of every SAE architecture: the encoded activation read back
after the edit, the positions left alone, and the cases refused when the promise cannot hold."""

import pytest
import torch

from millm.errors import InvalidRequest
from millm.interp.operators import HOLD_COSINE_MIN, Held, cap, feature_cap, hold
from millm.interp.sae import JumpReLUSAE, SAEWeights, StandardSAE, TopKSAE
from tests.support.tiny_saes import sae_tensors


def matched(seed: int = 0) -> SAEWeights:
    """A tiny SAE whose encoder roughly matches its decoder, as trained ones do (random ones are
    nearly orthogonal)."""
    tensors = sae_tensors(64, 128, seed=seed)
    noise = torch.randn(64, 128, generator=torch.Generator().manual_seed(seed + 7)) * 0.05
    tensors["W_enc"] = tensors["W_dec"].T.clone() + noise
    return SAEWeights(**tensors)


def saes():
    weights = matched()
    threshold = torch.rand(128, generator=torch.Generator().manual_seed(3)) * 0.2
    return {
        "standard": StandardSAE(weights),
        "jumprelu": JumpReLUSAE(weights, threshold),
        "topk": TopKSAE(weights, 8),
    }


def residual(rows: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("kind", ["standard", "jumprelu"])
def test_clamps_read_back_their_targets_together_at_every_position(kind):
    sae = saes()[kind]
    targets = {3: 2.5, 7: 0.75, 11: 4.0}
    edited = hold(sae, "s", [Held(i, t) for i, t in targets.items()])(residual())
    read = sae.encode(edited)
    for index, target in targets.items():
        assert torch.allclose(read[:, index], torch.full((12,), target), atol=1e-4), (
            index,
            read[:, index],
        )


def test_one_clamp_is_the_closed_form():
    sae = saes()["standard"]
    x = residual()
    g = float(sae.W_enc[:, 5] @ sae.W_dec[5])
    expected = x + ((1.5 - sae.pre_activation(x)[:, 5]) / g)[:, None] * sae.W_dec[5]
    assert torch.allclose(hold(sae, "s", [Held(5, 1.5)])(x), expected, atol=1e-5)


@pytest.mark.parametrize("kind", ["standard", "jumprelu", "topk"])
def test_ablate_zeroes_where_it_fires_and_leaves_silent_positions_bit_identical(kind):
    sae = saes()[kind]
    x = residual(rows=40)
    before = sae.encode(x)
    # a feature that fires at some positions and not at others
    index = int((before > 0).sum(0).argmax())
    firing = before[:, index] > 0
    assert 0 < int(firing.sum()) < 40
    edited = hold(sae, "s", [Held(index, 0.0)])(x)
    assert torch.equal(sae.encode(edited)[:, index], torch.zeros(40))
    assert torch.equal(edited[~firing], x[~firing])  # silent there: not touched at all
    assert not torch.equal(edited[firing], x[firing])


def test_an_ablated_feature_another_clamp_would_wake_is_held_at_zero():
    sae = saes()["standard"]
    x = residual(rows=64, seed=5)
    coupling = sae.W_enc.T @ sae.W_dec[9]  # how a push along W_dec[9] moves each pre-activation
    coupling[9] = -1.0
    index = int(coupling.argmax())  # the feature a push up along 9 raises most
    silent = sae.encode(x)[:, index] == 0
    woken = sae.encode(hold(sae, "s", [Held(9, 30.0)])(x))[:, index] > 0
    assert int((silent & woken).sum()) > 0  # clamping 9 alone wakes it where it was silent
    edited = hold(sae, "s", [Held(9, 30.0), Held(index, 0.0)])(x)
    assert torch.equal(sae.encode(edited)[:, index], torch.zeros(64))
    assert torch.allclose(sae.encode(edited)[:, 9], torch.full((64,), 30.0), atol=1e-4)


def test_topk_holds_the_pre_activation_and_reads_the_target_where_it_ranks():
    sae = saes()["topk"]
    x = residual(rows=30)
    # about the 8th largest: kept at some positions only
    target = float(sae.pre_activation(x).topk(8).values[:, -1].median())
    edited = hold(sae, "s", [Held(4, target)])(x)
    pre = sae.pre_activation(edited)
    assert torch.allclose(pre[:, 4], torch.full((30,), target), atol=1e-4)
    ranks = (pre > pre[:, 4:5]).sum(1)  # features above it at each position
    read = sae.encode(edited)[:, 4]
    assert torch.allclose(read[ranks < 8], torch.full((int((ranks < 8).sum()),), target), atol=1e-4)
    assert torch.equal(read[ranks >= 8], torch.zeros(int((ranks >= 8).sum())))
    assert 0 < int((ranks < 8).sum()) < 30  # both cases happen here


def test_cap_limits_the_component_and_leaves_the_rest():
    sae = saes()["standard"]
    x = residual(rows=40)
    unit = sae.W_dec[6] / sae.W_dec[6].norm()
    edited = feature_cap(sae, "s", 6, 0.5)(x)
    over = x @ unit > 0.5
    assert torch.allclose(edited @ unit, torch.clamp(x @ unit, max=0.5), atol=1e-5)
    assert torch.equal(edited[~over], x[~over])
    orthogonal = (edited - x) - ((edited - x) @ unit)[:, None] * unit
    assert float(orthogonal.abs().max()) < 1e-5  # only the component along the direction moved
    assert 0 < int(over.sum()) < 40


def test_operations_compute_in_float32_and_answer_in_the_residual_dtype():
    sae = saes()["standard"]
    x = residual().to(torch.bfloat16)
    for operation in (hold(sae, "s", [Held(3, 2.0)]), cap(sae.W_dec[3], 0.1)):
        out = operation(x)
        assert out.dtype == torch.bfloat16 and out.shape == x.shape


def test_a_jumprelu_target_at_or_below_the_threshold_is_refused():
    sae = saes()["jumprelu"]
    threshold = float(sae.threshold[3])
    with pytest.raises(InvalidRequest, match=f"threshold {threshold:.6g}") as refused:
        hold(sae, "sae_j", [Held(3, threshold * 0.5)], param="profile")
    assert refused.value.code == "operator_not_applicable" and refused.value.param == "profile"
    hold(sae, "sae_j", [Held(3, threshold + 0.01)])  # above it: fine
    hold(sae, "sae_j", [Held(3, 0.0)])  # ablate: fine


@pytest.mark.parametrize("normalisation", ["constant_norm_rescale", "layer_norm"])
def test_per_position_normalisation_refuses_clamp_and_ablate_but_not_cap(normalisation):
    sae = StandardSAE(matched(), normalize_activations=normalisation)
    for target in (2.0, 0.0):
        with pytest.raises(InvalidRequest, match=normalisation):
            hold(sae, "s", [Held(3, target)])
    x = residual()
    unit = sae.W_dec[3] / sae.W_dec[3].norm()
    assert float((feature_cap(sae, "s", 3, 0.2)(x) @ unit).max()) <= 0.2 + 1e-5


def test_a_feature_whose_encoder_misses_its_decoder_is_refused():
    tensors = sae_tensors(64, 128, seed=2)
    weights = SAEWeights(**tensors)
    cosine = torch.nn.functional.cosine_similarity(weights.W_enc.T, weights.W_dec, dim=1)
    index = int(cosine.abs().argmin())
    assert abs(float(cosine[index])) < HOLD_COSINE_MIN
    with pytest.raises(
        InvalidRequest, match=f"feature {index} of s has an encoder nearly orthogonal"
    ):
        hold(StandardSAE(weights), "s", [Held(index, 1.0)])


def test_a_dead_feature_cannot_be_held_or_capped():
    weights = matched()
    weights.W_dec[8] = 0.0
    with pytest.raises(InvalidRequest, match="nearly orthogonal"):
        hold(StandardSAE(weights), "s", [Held(8, 1.0)])
    with pytest.raises(InvalidRequest, match="zero vector"):
        feature_cap(StandardSAE(weights), "s", 8, 1.0)
