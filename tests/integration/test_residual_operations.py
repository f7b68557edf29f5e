"""Operations in the engine: per-row functions of the residual, applied after a point's additions in
prefill and in every decode step, to the rows that carry them and to their real positions only."""

from __future__ import annotations

from dataclasses import replace

import torch

from millm.engine.jobs import ResidualRead, ResidualsRead
from millm.engine.residual import ResidualEdit, combined
from tests.integration.engine_helpers import generate, prompt_ids, row

POINT = 1


def direction(lm, seed: int) -> torch.Tensor:
    """A fixed unit direction of the tiny model's residual."""
    generator = torch.Generator().manual_seed(seed)
    u = torch.randn(lm.model.config.hidden_size, generator=generator)
    return u / u.norm()


def clamp_along(u: torch.Tensor, target: float):
    """Set the residual's component along `u` to `target` at every position (what a clamp does)."""

    def operation(h: torch.Tensor) -> torch.Tensor:
        return h + (target - h @ u)[:, None] * u

    return operation


def with_reads(spec, point=POINT):
    """The row, reading its residual before and after the point's edits at every position."""
    reads = (ResidualRead(point, False, "all", "before"), ResidualRead(point, True, "all", "after"))
    return replace(spec, reads=reads)


def reads_of(outcome, index=0) -> dict[str, ResidualsRead]:
    return {e.tag: e for e in outcome.events if isinstance(e, ResidualsRead) and e.row == index}


def chunks(prompt_length: int, total: int) -> list[slice]:
    """The positions each forward pass fed: the prompt at once, then one per decode step."""
    return [slice(0, prompt_length)] + [slice(p, p + 1) for p in range(prompt_length, total)]


def test_an_operation_rewrites_every_position_after_the_additions(llama_lm):
    lm = llama_lm
    u = direction(lm, 0)
    vector = torch.linspace(-2, 2, lm.model.config.hidden_size)
    operation = clamp_along(u, 25.0)
    edit = ResidualEdit(((POINT, vector),), ((POINT, operation),))
    prompt = prompt_ids(lm, "The cat sat on")
    outcome = generate(lm, [with_reads(row(prompt, 12, edit=edit))])
    reads = reads_of(outcome)
    before, after = reads["before"].residuals, reads["after"].residuals
    assert before.shape[0] == len(prompt) + 11  # the last sampled token is never fed
    for part in chunks(
        len(prompt), before.shape[0]
    ):  # the same shapes as the hook saw: the same bits
        assert torch.equal(after[part], operation(before[part] + vector))
    assert torch.allclose(after @ u, torch.full((after.shape[0],), 25.0), atol=1e-4)
    plain = generate(lm, [row(prompt, 12)]).texts[0]
    assert outcome.texts[0] != plain  # the clamp changes what the model writes


def test_operations_apply_in_order_and_combined_keeps_both_edits(llama_lm):
    lm = llama_lm
    u, w = direction(lm, 1), direction(lm, 2)
    first, second = clamp_along(u, 10.0), clamp_along(w, -5.0)
    a = ResidualEdit(((POINT, torch.ones(lm.model.config.hidden_size)),), ((POINT, first),))
    b = ResidualEdit((), ((POINT, second),))
    edit = combined(a, b)
    assert combined(None, None) is None and combined(a, None) is a and combined(None, b) is b
    assert (
        edit is not None and edit.points == {POINT} and edit.operations_at(POINT) == (first, second)
    )
    prompt = prompt_ids(lm, "A river")
    reads = reads_of(generate(lm, [with_reads(row(prompt, 6, edit=edit))]))
    before, after = reads["before"].residuals, reads["after"].residuals
    for part in chunks(len(prompt), before.shape[0]):
        assert torch.equal(after[part], second(first(before[part] + 1.0)))


def test_an_operation_at_another_point_leaves_this_one_alone(llama_lm):
    lm = llama_lm
    edit = ResidualEdit((), ((2, clamp_along(direction(lm, 3), 9.0)),))
    prompt = prompt_ids(lm, "Once upon")
    reads = reads_of(generate(lm, [with_reads(row(prompt, 6, edit=edit))]))
    # point 1 has nothing to do
    assert torch.equal(reads["before"].residuals, reads["after"].residuals)
    assert edit.points == {2} and edit.operations_at(POINT) == ()


def test_additions_alone_are_exactly_the_added_vector(llama_lm):
    lm = llama_lm
    vector = torch.linspace(-3, 3, lm.model.config.hidden_size)
    adds = ResidualEdit(((POINT, vector),))
    prompt = prompt_ids(lm, "Every feature reads")
    outcome = generate(lm, [with_reads(row(prompt, 10, edit=adds))])
    reads = reads_of(outcome)
    assert torch.equal(reads["after"].residuals, reads["before"].residuals + vector)
    # The same additions spelled with an empty operations tuple run the same code to the same bits.
    again = generate(
        lm, [with_reads(row(prompt, 10, edit=ResidualEdit(((POINT, vector),), operations=())))]
    )
    assert again.texts == outcome.texts
    assert torch.equal(reads_of(again)["after"].residuals, reads["after"].residuals)


def test_rows_with_and_without_operations_share_a_batch(llama_lm):
    lm = llama_lm
    seen: list[tuple[int, ...]] = []
    clamp = clamp_along(direction(lm, 4), 30.0)

    def recording(h: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(h.shape))
        return clamp(h)

    vector = torch.linspace(-1, 1, lm.model.config.hidden_size)
    short, long = (
        prompt_ids(lm, "The cat"),
        prompt_ids(lm, "Seven apples were on the table near the"),
    )
    specs = [
        with_reads(row(short, 10, edit=ResidualEdit(((POINT, vector),), ((POINT, recording),)))),
        with_reads(row(long, 10)),
        with_reads(row(long, 10, edit=ResidualEdit(((POINT, vector),)))),
    ]
    solo = [generate(lm, [spec]) for spec in specs]
    assert seen[0] == (len(short), lm.model.config.hidden_size)  # the prompt's real positions only
    assert seen[1:] == [(1, lm.model.config.hidden_size)] * 9
    seen.clear()
    together = generate(lm, specs)
    # In the batch the short row is left-padded, yet its operation still sees only its own
    # positions.
    assert seen[0] == (len(short), lm.model.config.hidden_size) and len(seen) == 10
    untouched = reads_of(together, 1)
    # no edit: not even a copy differs
    assert torch.equal(untouched["after"].residuals, untouched["before"].residuals)
    added = reads_of(together, 2)
    assert torch.equal(added["after"].residuals, added["before"].residuals + vector)
    for index, alone in enumerate(solo):
        assert together.texts[index] == alone.texts[0]
        for tag in ("before", "after"):
            # A batch's matrix products have other shapes than a row's own, so not the same bits.
            assert torch.allclose(
                reads_of(together, index)[tag].residuals, reads_of(alone)[tag].residuals, atol=1e-5
            )
