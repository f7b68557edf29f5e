"""A transcoder set trained on SAELens's machinery: it learns each block's map (a known synthetic
MLP), its export is SAELens's own transcoder (loaded by SAELens) and millm's transcoder set
(read by millm) computing the same thing, and a checkpoint keeps its training scales."""

from __future__ import annotations

import torch
from sae_lens.saes.transcoder import JumpReLUSkipTranscoder, JumpReLUTranscoder

from millm.interp.dictionary_recipes import Recipe
from millm.interp.dictionary_training import DictionaryTrainer
from millm.interp.transcoders import read_transcoder_set

D, BLOCKS = 16, 2


class SyntheticMLPs:
    """Two blocks' 'MLPs' with outputs of very different size: y_b = s_b * relu(x @ A_b) @ B_b
    + c_b, x with an offset (as a residual stream has)."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.g = g
        self.a = [torch.randn(D, 24, generator=g) for _ in range(BLOCKS)]
        self.b = [torch.randn(24, D, generator=g) / 5 for _ in range(BLOCKS)]
        self.c = [torch.randn(D, generator=g) for _ in range(BLOCKS)]
        self.size = [30.0, 0.02]

    def y(self, block: int, x: torch.Tensor) -> torch.Tensor:
        """Block `block`'s output at inputs x."""
        return self.size[block] * (torch.relu(x @ self.a[block]) @ self.b[block] + self.c[block])

    def rows(self, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """n packed rows `[x0 | y0 | x1 | y1]`, and the inputs by block."""
        xs = [torch.randn(n, D, generator=self.g) + 3.0 for _ in range(BLOCKS)]
        parts = [t for b in range(BLOCKS) for t in (xs[b], self.y(b, xs[b]))]
        return torch.cat(parts, dim=1), xs


def recipe(**options) -> Recipe:
    base = dict(architecture="batchtopk", d_in=D, d_sae=96, hook_name="", model_name="synthetic",
                training_tokens=256 * 300, batch_tokens=256, buffer_tokens=1024, lr=3e-3, k=8,
                transcoders=BLOCKS, skip=True)  # fmt: skip
    return Recipe(**(base | options))  # type: ignore[arg-type]


def fve(predicted: torch.Tensor, target: torch.Tensor) -> float:
    return float(1 - (predicted - target).pow(2).sum() / (target - target.mean(0)).pow(2).sum())


def train(trainer: DictionaryTrainer, mlps: SyntheticMLPs, until: int) -> None:
    while trainer.progress.tokens < until and not trainer.done:
        trainer.feed(mlps.rows(512)[0], trainer.progress.windows + 1)


def test_a_transcoder_set_learns_each_block_and_exports_what_sae_lens_and_millm_read(tmp_path):
    mlps = SyntheticMLPs()
    trainer = DictionaryTrainer(recipe())
    train(trainer, mlps, 10**9)
    assert trainer.done and trainer.progress.curve[-1]["fve"] > 0.8
    folder = tmp_path / "set"
    trainer.export(folder, {"training_id": "t1", "corpus": {"name": "synthetic"}})

    held_rows, xs = mlps.rows(2000)
    found = read_transcoder_set(folder)
    assert found.kind == "transcoder_set" and sorted(found.layers) == [0, 1]
    assert found.input_hook == "mlp.hook_in" and found.architecture == "jumprelu"
    for block in range(BLOCKS):
        x, y = xs[block], mlps.y(block, xs[block])
        theirs = JumpReLUSkipTranscoder.load_from_disk(folder / f"layer_{block}")
        assert theirs.cfg.metadata.hook_name == f"blocks.{block}.hook_mlp_in"
        assert theirs.cfg.metadata.millm_provenance["training_id"] == "t1"
        # SAELens's end-of-training figures, as its own SAE saves keep them
        assert 0 < theirs.cfg.metadata.l0 < theirs.cfg.d_sae
        assert theirs.cfg.metadata.num_dead_features >= 0
        with torch.no_grad():
            predicted = theirs(x)
        # each block's map learnt in the model's own units, though they differ 1500-fold
        assert fve(predicted, y) > 0.8, block
        sae = found.layers[block]
        mine = sae.decode(sae.encode(x)) + x @ found.skips[block].T
        torch.testing.assert_close(mine, predicted, rtol=1e-4, atol=1e-4 * float(y.abs().max()))
        l0 = float((sae.encode(x) > 0).float().sum(-1).mean())
        assert 3 < l0 < 16  # BatchTopK's threshold keeps about k = 8 per row at inference


def test_without_a_skip_connection_it_is_sae_lens_s_plain_jumprelu_transcoder(tmp_path):
    mlps = SyntheticMLPs(1)
    trainer = DictionaryTrainer(recipe(skip=False, architecture="jumprelu", k=None,
                                       l0_coefficient=0.5, training_tokens=256 * 200))  # fmt: skip
    train(trainer, mlps, 10**9)
    trainer.export(tmp_path / "set", {"training_id": "t2"})
    loaded = JumpReLUTranscoder.load_from_disk(tmp_path / "set" / "layer_1")
    assert not hasattr(loaded, "W_skip")
    assert read_transcoder_set(tmp_path / "set").skips == {}
    _, xs = mlps.rows(1000)
    with torch.no_grad():
        assert fve(loaded(xs[1]), mlps.y(1, xs[1])) > 0.5


def test_a_resumed_transcoder_training_keeps_its_scales_and_weights(tmp_path):
    mlps = SyntheticMLPs(2)
    trainer = DictionaryTrainer(recipe())
    train(trainer, mlps, 256 * 40)
    trainer.checkpoint(tmp_path / "checkpoint")
    resumed = DictionaryTrainer(recipe(), tmp_path / "checkpoint")
    assert resumed.progress.tokens == trainer.progress.tokens and resumed.progress.resumes
    for before, after in zip(trainer.trainers, resumed.trainers, strict=True):
        for name, value in before.sae.state_dict().items():
            torch.testing.assert_close(after.sae.state_dict()[name], value, msg=name)
        assert float(after.sae.scale_out) != 1.0  # the first batch's scale, not a fresh one
    steps = resumed.progress.steps
    train(resumed, mlps, 256 * 60)
    assert resumed.progress.steps > steps and resumed.progress.curve[-1]["fve"] > 0.5
