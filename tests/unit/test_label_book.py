"""The label store, the LabelBook and its ranked search (SQLite FTS5, BM25), and decoder
neighbours."""

from __future__ import annotations

import asyncio
import json
import threading

import numpy as np
import pytest
import torch

from millm.errors import SAEFormatError
from millm.formats.labels import LabelDocument, read_document
from millm.interp.formats import read_sae
from millm.kernel.books.label_search import LabelIndex, fts_query
from millm.kernel.books.labels import LabelBook
from millm.kernel.books.profiles import ProfileBook
from millm.kernel.steering.decoders import DecoderCache, decoder_of, neighbours
from millm.kernel.steering.live import Steering
from millm.kernel.steering.saes import SAERegistry
from millm.store.database import Store, database_url
from millm.store.labels import label_rows, labels_seeded, merge_labels, replace_labels
from millm.store.saes import add_sae
from tests.support.tiny_saes import build_saelens


@pytest.fixture
def store(tmp_path):
    s = Store(database_url(tmp_path, None))
    yield s
    s.close()


def plain(labels: dict[int, str | dict]) -> LabelDocument:
    return read_document(
        json.dumps({str(k): v for k, v in labels.items()}).encode(), "application/json"
    )


@pytest.mark.parametrize(
    "text, query",
    [
        ("pirate", '"pirate"*'),
        ("Pirate  SHIP", '"pirate"* OR "ship"*'),
        (
            'a "quoted" *star NEAR(x, y) AND OR -not',
            '"a"* OR "quoted"* OR "star"* OR "near"* OR "x"* OR "y"* OR "and"* OR "or"* OR "not"*',
        ),
        ("snake_case café", '"snake"* OR "case"* OR "café"*'),
        ("ship ship", '"ship"*'),
        ("", None),
        ('*** "" ^ :', None),
    ],
)
def test_user_text_becomes_a_safe_query(text, query):
    assert fts_query(text) == query


RANKED = [
    (0, "pirate ship captain", "x", ("", "")),
    (1, "cargo ship", "x", ("", "")),
    (2, "music and melody", "x", ("", "")),
    (3, "ship of the line", "x", ("", "")),
    (
        4,
        "weather",
        "x",
        ("", "pirates sail the seas"),
    ),  # the word only in an example: ranks, below a label
]


def test_search_ranks_by_relevance():
    index = LabelIndex(RANKED)
    # A query matching all of one label's words ranks it first; the partial matches follow, the
    # non-matches never come.
    found = index.search("pirate captain ship", 10)
    assert found[0].index == 0 and {f.index for f in found} == {0, 1, 3, 4}
    # larger is better
    assert [f.score for f in found] == sorted((f.score for f in found), reverse=True)
    # A word in some labels ranks those, and only those.
    assert {f.index for f in index.search("ship", 10)} == {0, 1, 3}
    assert [f.index for f in index.search("melody ship", 10)][0] == 2 and 4 not in [
        f.index for f in index.search("melody ship", 10)
    ]
    # Stemming and prefixes: "pirates" and "pir" find "pirate"; a word in the label outranks one in
    # the other text.
    assert [f.index for f in index.search("pirates", 10)] == [0, 4]
    assert [f.index for f in index.search("pir", 10)] == [0, 4]
    assert [f.index for f in index.search("sail", 10)] == [4]
    assert len(index.search("ship", 2)) == 2
    index.close()


@pytest.mark.parametrize(
    "query",
    [
        '"',
        '"pirate',
        "pirate*",
        "*",
        "NEAR(pirate ship)",
        "pirate AND",
        "OR",
        "(",
        ")",
        "^ship",
        "ship:",
        "col:pirate",
        "'; DROP TABLE labels; --",
        "\x00",
        "é" * 3,
    ],
)
def test_fts_syntax_in_the_query_never_errors(query):
    index = LabelIndex(RANKED)
    index.search(query, 10)
    index.close()


def test_replace_merge_and_clear_count_and_persist(store, tmp_path):
    book = LabelBook(store)
    counts = book.replace("sae_a", plain({1: "one", 2: "two", 3: ""}))
    assert (counts.imported, counts.replaced, counts.skipped, counts.total) == (2, 0, 1, 2)
    counts = book.merge("sae_a", plain({2: "TWO", 5: "five"}))
    assert (counts.imported, counts.replaced, counts.total) == (2, 1, 3)
    assert {i: e["label"] for i, e in book.entries("sae_a").items()} == {
        1: "one",
        2: "TWO",
        5: "five",
    }
    counts = book.replace("sae_a", plain({9: "nine"}))
    assert (counts.replaced, counts.total) == (3, 1)
    assert book.entries("sae_b") == {}
    again = LabelBook(Store(database_url(tmp_path, None)))  # another process on the same database
    assert again.entries("sae_a") == {9: {"label": "nine", "source": "plain"}}
    assert book.clear("sae_a") == 1 and book.count("sae_a") == 0


def test_a_write_is_seen_by_the_next_search(store):
    book = LabelBook(store)
    book.replace("sae_a", plain({1: "pirate ship", 2: "music"}))
    assert [f.index for f in book.search("sae_a", "pirate", 10)] == [1]
    book.merge("sae_a", plain({2: "pirate song"}))
    assert sorted(f.index for f in book.search("sae_a", "pirate", 10)) == [1, 2]
    book.clear("sae_a")
    assert book.search("sae_a", "pirate", 10) == []


def test_an_empty_query_lists_every_label_by_index(store):
    book = LabelBook(store)
    book.replace("sae_a", plain({7: "seven", 2: "two", 4: "four"}))
    assert [(f.index, f.score, f.source) for f in book.search("sae_a", "", 2)] == [
        (2, None, "plain"),
        (4, None, "plain"),
    ]
    assert [f.index for f in book.search("sae_a", " ** ", 10)] == [2, 4, 7]


def test_kept_sets_are_bounded(store):
    book = LabelBook(store, kept=2)
    for name in ("a", "b", "c"):
        book.replace(f"sae_{name}", plain({1: name}))
        book.search(f"sae_{name}", name, 5)
    assert list(book._sets) == ["sae_b", "sae_c"]
    assert [f.label for f in book.search("sae_a", "a", 5)] == ["a"]  # read again from the store
    assert list(book._sets) == ["sae_c", "sae_a"]


def test_searches_from_several_threads(store):
    book = LabelBook(store)
    book.replace(
        "sae_a", plain({i: f"label {i} {'pirate' if i % 3 == 0 else 'sea'}" for i in range(300)})
    )
    errors: list[BaseException] = []

    def search():
        try:
            for _ in range(50):
                assert len(book.search("sae_a", "pirate", 1000)) == 100
        except BaseException as exc:  # reported below, on the test thread
            errors.append(exc)

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def test_an_sae_files_labels_are_seeded_once(store, tmp_path):
    info, _ = read_sae(build_saelens(tmp_path / "sae", d_sae=16))
    book = LabelBook(store)
    book.seed(info)
    entries = book.entries(info.id)
    assert len(entries) == 16 and entries[10] == {
        "label": "feature 10 paris",
        "top_tokens": ["tok10"],
        "source": "sae_file",
    }
    book.clear(info.id)
    book.seed(info)  # cleared by a user: not brought back
    assert book.count(info.id) == 0


def test_labels_stored_before_seeding_win(store, tmp_path):
    info, _ = read_sae(build_saelens(tmp_path / "sae", d_sae=16))
    book = LabelBook(store)
    book.replace(info.id, plain({3: "mine"}))
    book.seed(info)
    assert {i: e["label"] for i, e in book.entries(info.id).items()} == {3: "mine"}


def test_an_sae_file_with_labels_past_its_width_is_refused(store, tmp_path):
    directory = build_saelens(tmp_path / "sae", d_sae=16)
    (directory / "feature_labels.json").write_text(json.dumps({"3": "x", "16": "too far"}))
    info, _ = read_sae(directory)
    with pytest.raises(
        SAEFormatError,
        match=r"feature_labels.json: entry '16': feature 16 is past the SAE's width \(16 features",
    ):
        LabelBook(store).seed(info)
    assert not labels_seeded(store, info.id)


def test_neighbours_are_the_highest_decoder_cosines(tmp_path):
    _, sae = read_sae(build_saelens(tmp_path / "sae", d_sae=128, seed=3))
    sae.W_dec[5] = 0.0  # a dead row: cosine 0 with everything, norm 0
    sae.W_dec[7] *= 3.0
    decoder = decoder_of(sae)
    rows = sae.W_dec
    cosines = torch.nn.functional.cosine_similarity(rows, rows[7][None, :], dim=-1)
    cosines[7] = -2
    expected = torch.argsort(cosines, descending=True, stable=True)[:10].tolist()
    found = neighbours(decoder, 7, 10)
    assert [i for i, _ in found] == expected
    assert np.allclose([c for _, c in found], cosines[expected].numpy(), atol=1e-5)
    assert (
        decoder.norms[7] == pytest.approx(float(rows[7].norm()), rel=1e-6) and decoder.norms[5] == 0
    )
    assert [c for i, c in neighbours(decoder, 5, 127)] == [0.0] * 127
    assert len(neighbours(decoder, 0, 1000)) == 127


def test_the_decoder_cache_is_bounded_and_reads_a_registered_sae_from_its_file(tmp_path, store):
    saes = SAERegistry(store, tmp_path / "hub", LabelBook(store))
    cache = DecoderCache(Steering(store, saes, ProfileBook(store)), saes, kept=2)
    directory = build_saelens(tmp_path / "sae", d_sae=16)
    _, sae = read_sae(directory)
    for name in ("a", "b", "c"):
        cache.keep(name, decoder_of(sae))
    assert cache.get("a") is None and cache.get("b") is not None and cache.get("c") is not None
    info, _ = saes.register(str(directory), None, None, None)
    decoder = asyncio.run(cache.of(info.id))  # not attached: read from the file, then kept
    assert decoder.norms.shape == (16,) and cache.get(info.id) is decoder and cache.get("b") is None
    assert decoder.norms[3] == pytest.approx(float(sae.W_dec[3].float().norm()), rel=1e-5)


def test_the_store_merges_past_one_in_list(store):
    assert replace_labels(store, "sae_a", [(i, f"l{i}", "plain", {}) for i in range(1200)]) == (
        0,
        1200,
    )
    assert merge_labels(
        store, "sae_a", [(i, "new", "mistudio", {"method": "m"}) for i in range(1100, 1300)]
    ) == (100, 1300)
    rows = label_rows(store, "sae_a")
    assert [r.feature for r in rows] == list(range(1300)) and (
        rows[1150].label,
        rows[1150].detail,
    ) == ("new", {"method": "m"})


def test_a_search_holding_an_index_survives_a_write(store):
    book = LabelBook(store)
    book.replace("sae_a", plain({1: "pirate ship"}))
    book.search("sae_a", "pirate", 5)
    held = book._set("sae_a").index
    # drops the cached set while a search may still hold its index
    book.merge("sae_a", plain({2: "pirate radio"}))
    assert held is not None and [f.index for f in held.search("pirate", 5)] == [1]
    assert sorted(f.index for f in book.search("sae_a", "pirate", 5)) == [1, 2]


def test_sae_registered_before_labels_were_stored_get_their_own_at_start(store, tmp_path):
    from millm.kernel.steering.saes import SAERegistry

    info, _ = read_sae(build_saelens(tmp_path / "sae", d_sae=16))
    add_sae(store, info.to_dict())  # as an older version left it: registered, no labels stored
    registry = SAERegistry(store, tmp_path / "hub", LabelBook(store))
    assert (
        len(registry.labels(info.id)) == 16 and registry.labels(info.id)[3]["source"] == "sae_file"
    )
