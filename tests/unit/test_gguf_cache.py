"""The cache of dequantised GGUF copies keeps the GGUF_CACHE_ENTRIES used last and deletes the rest.

The copies here are written in the layout a conversion leaves (a directory named by the file's
key, holding the weights and the meta file), so that each use is a cache hit: converting real
GGUF files three times over would take minutes on this machine.
"""

import json
import os

from millm.engine.loader import (
    GGUF_CACHE_ENTRIES,
    GGUF_META,
    gguf_cache_key,
    gguf_checkpoint,
)
from millm.engine.sources import ModelSource

SECOND = 1_000_000_000


def gguf_source(directory, name):
    """A .gguf file (its bytes never read on a hit) and its source."""
    directory.mkdir(exist_ok=True)
    (directory / name).write_bytes(name.encode() * 100)
    return ModelSource("gguf", str(directory / name), directory, name, name, "local", None)


def cached_copy(cache, source, used_at_ns):
    """The entry a conversion of `source` leaves, last used at `used_at_ns`."""
    entry = cache / gguf_cache_key(source.directory / source.gguf_file)
    entry.mkdir(parents=True)
    (entry / "model.safetensors").write_bytes(b"\0" * 4096)
    meta = {
        "source": str(source.directory / source.gguf_file),
        "sha256": f"{source.name:0<64}",
        "file_type": "Q4_1",
    }
    (entry / GGUF_META).write_text(json.dumps(meta))
    os.utime(entry / GGUF_META, ns=(used_at_ns, used_at_ns))
    return entry


def test_the_least_recently_used_copies_are_deleted_and_the_used_one_kept(tmp_path):
    cache, files = tmp_path / "cache" / "gguf", tmp_path / "models"
    sources = [gguf_source(files, f"m{i}.gguf") for i in range(4)]
    t0 = 1_700_000_000 * SECOND
    # Used in the order m0, m1, m2, m3: m0 the least recent.
    entries = [cached_copy(cache, source, t0 + i * SECOND) for i, source in enumerate(sources)]
    foreign, partial = cache / "notes", cache / f".{entries[0].name}.partial"
    foreign.mkdir()
    partial.mkdir()

    # Using m1 again makes it the most recent: with 2 kept, m1 and the next most recent (m3) stay.
    assert GGUF_CACHE_ENTRIES == 2
    path, meta = gguf_checkpoint(sources[1], cache)
    assert (
        path == entries[1] and meta["file_type"] == "Q4_1" and meta["sha256"].startswith("m1.gguf")
    )
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == sorted(
        [entries[1].name, entries[3].name, "notes"]
    )
    # a conversion in progress and what the cache did not write
    assert partial.is_dir() and foreign.is_dir()
    assert (entries[1] / "model.safetensors").stat().st_size == 4096  # the kept copy is whole


def test_the_copy_in_use_is_kept_whatever_the_bound(tmp_path):
    cache, files = tmp_path / "cache", tmp_path / "models"
    old, new = gguf_source(files, "old.gguf"), gguf_source(files, "new.gguf")
    t0 = 1_700_000_000 * SECOND
    cached_copy(cache, new, t0)
    cached_copy(cache, old, t0 + SECOND)  # the other copy was used more recently...
    path, _ = gguf_checkpoint(new, cache, keep=1)  # ...but this use makes `new` the most recent
    assert [p.name for p in cache.iterdir()] == [path.name]
    path, _ = gguf_checkpoint(new, cache, keep=0)  # even 0 never deletes the copy being loaded
    assert (path / GGUF_META).is_file()


def test_a_changed_file_is_a_new_entry_and_the_old_copy_goes_when_past_the_bound(tmp_path):
    cache, files = tmp_path / "cache", tmp_path / "models"
    source = gguf_source(files, "model.gguf")
    t0 = 1_700_000_000 * SECOND
    before = cached_copy(cache, source, t0)
    (files / "model.gguf").write_bytes(b"changed" * 50)  # a new size: a new key
    after = cached_copy(cache, source, t0 + SECOND)
    assert before.name != after.name
    gguf_checkpoint(source, cache, keep=1)
    assert [p.name for p in cache.iterdir()] == [after.name]
