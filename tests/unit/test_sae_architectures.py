"""Each SAE architecture encodes and decodes exactly as it defines, against a direct computation."""

import pytest
import torch

from millm.interp.sae import JumpReLUSAE, SAEWeights, StandardSAE, TopKSAE
from tests.support.tiny_saes import sae_tensors

X = torch.randn(5, 64, generator=torch.Generator().manual_seed(3))


def weights(seed=0):
    return SAEWeights(**sae_tensors(64, 128, seed))


def pre(w: SAEWeights, x, apply_b_dec=True):
    return ((x - w.b_dec) if apply_b_dec else x) @ w.W_enc + w.b_enc


@pytest.mark.parametrize("apply_b_dec", [True, False])
def test_standard_is_relu_of_pre(apply_b_dec):
    w = weights()
    sae = StandardSAE(w, apply_b_dec_to_input=apply_b_dec)
    assert torch.allclose(sae.encode(X), torch.relu(pre(w, X, apply_b_dec)), atol=1e-6)


def test_jumprelu_zeroes_below_threshold_and_keeps_relu():
    w = weights()
    threshold = torch.full((128,), 0.3)
    threshold[:4] = -1.0  # a negative threshold: ReLU still zeroes negative pre-activations
    sae = JumpReLUSAE(w, threshold)
    p = pre(w, X)
    expected = torch.where(p > threshold, torch.relu(p), torch.zeros_like(p))
    assert torch.allclose(sae.encode(X), expected, atol=1e-6)
    assert bool((sae.encode(X)[:, :4] >= 0).all())
    assert int((sae.encode(X) > 0).sum()) < int((torch.relu(p) > 0).sum())  # the threshold matters


def test_topk_keeps_k_largest_through_relu():
    w = weights()
    sae = TopKSAE(w, k=8)
    got = sae.encode(X)
    p = pre(w, X)
    for row in range(X.shape[0]):
        top = torch.topk(p[row], 8)
        expected = torch.zeros(128)
        expected[top.indices] = torch.relu(top.values)
        assert torch.allclose(got[row], expected, atol=1e-6)
    assert int((got > 0).sum(-1).max()) <= 8


def test_decode_is_affine():
    w = weights()
    sae = StandardSAE(w)
    f = sae.encode(X)
    assert torch.allclose(sae.decode(f), f @ w.W_dec + w.b_dec, atol=1e-6)


def test_constant_norm_rescale_scales_in_and_out():
    w = weights()
    sae = StandardSAE(w, normalize_activations="constant_norm_rescale")
    coeff = 64**0.5 / X.norm(dim=-1, keepdim=True)
    expected_f = torch.relu((X * coeff - w.b_dec) @ w.W_enc + w.b_enc)
    assert torch.allclose(sae.encode(X), expected_f, atol=1e-5)
    assert torch.allclose(
        sae.decode(expected_f, X), (expected_f @ w.W_dec + w.b_dec) / coeff, atol=1e-5
    )


def test_layer_norm_normalisation():
    w = weights()
    sae = StandardSAE(w, normalize_activations="layer_norm")
    mu = X.mean(-1, keepdim=True)
    std = (X - mu).std(-1, keepdim=True)
    normed = (X - mu) / (std + 1e-5)
    f = torch.relu((normed - w.b_dec) @ w.W_enc + w.b_enc)
    assert torch.allclose(sae.encode(X), f, atol=1e-5)
    assert torch.allclose(sae.decode(f, X), (f @ w.W_dec + w.b_dec) * std + mu, atol=1e-5)


def test_direction_is_the_weighted_sum_of_decoder_rows():
    w = weights()
    sae = StandardSAE(w)
    got = sae.direction({3: 2.0, 17: -1.5})
    assert torch.allclose(got, 2.0 * w.W_dec[3] - 1.5 * w.W_dec[17], atol=1e-6)
    assert torch.equal(sae.direction({}), torch.zeros(64))


@pytest.mark.parametrize(
    "make",
    [
        lambda w: StandardSAE(w),
        lambda w: JumpReLUSAE(w, torch.linspace(-0.5, 0.8, 128)),
        lambda w: TopKSAE(w, k=8),
        lambda w: StandardSAE(w, normalize_activations="layer_norm"),
    ],
    ids=["standard", "jumprelu", "topk", "layer-norm"],
)
def test_a_few_features_encode_as_their_columns_of_the_whole(make):
    """Sensing encodes a cluster's members alone: the same numbers as the whole encode's columns."""
    sae = make(weights())
    index = torch.tensor([3, 77, 5, 120])
    assert torch.allclose(sae.encode_features(X, index), sae.encode(X)[:, index], atol=1e-6)
