"""The VectorBook over a real store and the tiny Llama loaded in this process: the plan resolver's
point (Attached.point's rule), tensor and revision, its refusals (another model by name or width,
a layer past the model, no model), None for an unknown or deleted vector, names kept unique, the
bound, and a schema-4 database migrating with its rows kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from millm.engine.residual import EMBEDDINGS
from millm.errors import Conflict, InvalidRequest, ModelNotLoaded, NotFound
from millm.interp.sae_files import SAEInfo
from millm.interp.steering import Attached
from millm.kernel.books.vectors import VectorBook
from millm.store.database import SCHEMA_VERSION, Store, database_url
from millm.store.profiles import profile_rows
from millm.store.settings import get_setting
from tests.support.old_schemas import build, old_rows


def meta(
    name: str,
    model: str = "tiny-llama",
    d_model: int = 64,
    layer: int = 1,
    hook_point: str = "resid_post",
) -> dict:
    return {
        "name": name,
        "description": "",
        "model": model,
        "d_model": d_model,
        "layer": layer,
        "hook_point": hook_point,
        "method": "mean",
        "pairs": 3,
        "norm": 2.5,
        "agreement": 1.0,
    }


def unit(d: int = 64, seed: int = 0) -> np.ndarray:
    values = np.random.default_rng(seed).normal(size=d).astype(np.float32)
    return values / np.linalg.norm(values)


def resolved(book: VectorBook, key: str, lm) -> tuple[int, torch.Tensor]:
    found = book.vector(key, lm)
    assert found is not None, key
    return found


@pytest.fixture
def store(tmp_path):
    store = Store(database_url(tmp_path, None))
    yield store
    store.close()


def test_the_resolver_gives_the_point_and_the_stored_direction(store, llama_lm):
    assert llama_lm.name == "tiny-llama"
    book = VectorBook(store)
    values = unit()
    revision = book.revision
    row = book.create(meta("post-1"), values)
    assert book.revision > revision  # a cached plan naming vectors is resolved again
    point, tensor = resolved(book, row["id"], llama_lm)
    assert (
        point == 1
        and tensor.dtype == torch.float32
        and tensor.numpy().tobytes() == values.tobytes()
    )
    assert resolved(book, "post-1", llama_lm)[1] is tensor  # by name too, the same read-only tensor
    with pytest.raises(ModelNotLoaded):
        book.vector("post-1", None)
    for layer, hook_point in ((0, "resid_pre"), (2, "resid_pre"), (0, "resid_post")):
        info = SAEInfo(
            id="sae_x",
            format="saelens",
            path="",
            architecture="standard",
            d_in=64,
            d_sae=8,
            layer=layer,
            hook_point=hook_point,
            hook_name=None,
        )
        created = book.create(
            meta(f"{hook_point}-{layer}", layer=layer, hook_point=hook_point), values
        )
        assert resolved(book, created["id"], llama_lm)[0] == Attached(info, None, layer).point
    assert resolved(book, "resid_pre-0", llama_lm)[0] == EMBEDDINGS


@pytest.mark.parametrize(
    "change, phrase",
    [
        (
            {"model": "gemma-2-2b"},
            "trained on model 'gemma-2-2b' (d_model 64), not on the loaded model 'tiny-llama' "
            "(d_model 64)",
        ),
        (
            {"d_model": 32},
            "trained on model 'tiny-llama' (d_model 32), not on the loaded model 'tiny-llama' "
            "(d_model 64)",
        ),
        ({"layer": 3}, "at layer 3, past tiny-llama's 3 layers"),
    ],
)
def test_a_vector_of_another_model_is_refused_naming_it_and_both_models(
    store, llama_lm, change, phrase
):
    book = VectorBook(store)
    row = book.create({**meta("elsewhere"), **change}, unit(change.get("d_model", 64)))
    with pytest.raises(InvalidRequest) as refused:
        book.vector(row["id"], llama_lm)
    assert (
        refused.value.status == 400
        and refused.value.code == "vector_not_applicable"
        and refused.value.param == "vector_id"
    )
    assert phrase in refused.value.message and f"'elsewhere' ({row['id']})" in refused.value.message


def test_unknown_and_deleted_vectors_are_refused_and_kept_ones_survive_a_new_book(store, llama_lm):
    book = VectorBook(store)
    kept, gone = book.create(meta("kept"), unit(seed=1)), book.create(meta("gone"), unit(seed=2))
    assert book.delete("gone").id == gone["id"]
    assert (
        book.vector(gone["id"], llama_lm) is None
        and book.vector("vec_000000000000", llama_lm) is None
    )  # the planner says vector_not_found
    with pytest.raises(NotFound):
        book.get(gone["id"])
    again = VectorBook(store)  # what a restart reads
    assert [row["name"] for row in again.all()] == ["kept"]
    assert resolved(again, "kept", llama_lm)[1].numpy().tobytes() == unit(seed=1).tobytes()
    assert again.get("kept") == book.get(kept["id"])


def test_names_are_unique_and_the_book_is_bounded(store):
    book = VectorBook(store, limit=3)
    book.create(meta("a"), unit())
    with pytest.raises(Conflict) as taken:
        book.create(meta("a"), unit())
    assert taken.value.code == "vector_exists" and taken.value.param == "name"
    assert book.create(meta("a"), unit(), on_conflict="rename")["name"] == "a-2"
    book.create(meta("b"), unit())
    with pytest.raises(Conflict) as full:
        book.create(meta("c"), unit())
    assert full.value.code == "vectors_full" and len(book.all()) == 3


def test_a_schema_4_database_migrates_keeping_its_rows(tmp_path):
    url = database_url(tmp_path, None)
    build(url, 4, old_rows(4))  # the tables and rows as schema 4's code left them
    new = Store(url)
    assert get_setting(new, "schema_version") == SCHEMA_VERSION
    assert [p["name"] for p in profile_rows(new)] == ["calm", "river-run", "ünïcode ✓"]
    book = VectorBook(new)
    assert book.all() == []
    book.create(meta("fresh"), unit())
    assert [row["name"] for row in VectorBook(new).all()] == ["fresh"]
    new.close()
