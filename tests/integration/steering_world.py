"""A tiny steering world for engine tests: two SAEs (standard at block 1, TopK at block 2)
attached to the tiny Llama, the planner that turns specs into edits, and reading helpers."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import torch

from millm.engine.jobs import ResidualRead, ResidualsRead
from millm.formats.profiles import validate_spec
from millm.kernel.books.documents import CircuitBook, ClusterBook
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.steering.base_fit import DialLimits
from millm.kernel.steering.live import Steering
from millm.kernel.steering.plans import Planner
from millm.kernel.steering.saes import SAERegistry
from millm.store.database import Store, database_url
from tests.support.tiny_saes import build_saelens, sae_tensors


def matched_tensors(seed: int) -> dict:
    """An SAE whose encoder roughly matches its decoder, as trained ones do."""
    tensors = sae_tensors(64, 128, seed=seed)
    tensors["W_enc"] = (
        tensors["W_dec"].T.clone()
        + torch.randn(64, 128, generator=torch.Generator().manual_seed(seed + 1)) * 0.05
    )
    return tensors


@dataclass
class World:
    steering: Steering
    planner: Planner
    ids: dict[int, str]
    store: Store

    def sae(self, layer: int):
        return self.steering.attached[self.ids[layer]].sae


def make_world(llama_lm, tmp_path, v1_profile: dict | None = None) -> World:
    store = Store(database_url(tmp_path, None))
    registry = SAERegistry(store, tmp_path / "hub", LabelBook(store))
    ids = {}
    for layer, architecture in ((1, "standard"), (2, "topk")):
        config = {"k": 16} if architecture == "topk" else None
        path = build_saelens(
            tmp_path / f"sae{layer}",
            layer=layer,
            architecture=architecture,
            tensors=matched_tensors(60 + layer),
            config=config,
        )
        info, _ = registry.register(str(path), None, None, None)
        ids[layer] = info.id
    if v1_profile is not None:  # stored as schema 4 wrote it, before the book opens
        with store.transaction() as conn:
            document = {
                **v1_profile,
                "steering": [{**e, "sae_id": ids[1]} for e in v1_profile["steering"]],
            }
            conn.exec_driver_sql(
                "INSERT INTO millm_profiles (id, name, document, created_at, updated_at) VALUES "
                "(?, ?, ?, 1.0, 1.0)",
                ("prof_v1", v1_profile["name"], json.dumps(document)),
            )
    steering = Steering(store, registry, ProfileBook(store))
    for layer in ids:
        steering.attach(llama_lm, ids[layer], None)
    return World(
        steering,
        Planner(steering, ClusterBook(store, 2.0), CircuitBook(store), DialLimits()),
        ids,
        store,
    )


def spec_of(world: World, features: list[dict], layer: int = 1, **more) -> dict:
    return validate_spec({"steering": [{"sae_id": world.ids[layer], "features": features}], **more})


def reading(spec_row, point: int = 1):
    """The row, capturing its residual at `point` before and after the point's edits at every
    position it feeds."""
    reads = (ResidualRead(point, False, "all", "before"), ResidualRead(point, True, "all", "after"))
    return replace(spec_row, reads=reads)


def captured(outcome, tag: str, index: int = 0) -> torch.Tensor:
    return next(
        e
        for e in outcome.events
        if isinstance(e, ResidualsRead) and e.row == index and e.tag == tag
    ).residuals
