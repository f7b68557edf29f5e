"""The model registry, checkpoint inspection, the memory rule and the model slot's leases, on
real tiny checkpoints, real GGUF files and a real scheduler."""

import json
import threading
import time

import gguf
import numpy as np
import pytest

from millm.engine.jobs import EmbeddingJob, EmbeddingsReady, JobFailed
from millm.engine.scheduler import Scheduler
from millm.engine.sources import resolve_source
from millm.errors import (
    Conflict,
    InsufficientMemoryToLoad,
    InvalidRequest,
    ModelNotFound,
    ModelSourceError,
    UnsupportedQuantization,
)
from millm.kernel.model.checkpoints import (
    Checkpoint,
    DeviceMemory,
    check_memory,
    check_quantization,
    inspect,
)
from millm.kernel.model.registry import ModelRegistry
from millm.kernel.model.slot import ModelSlot, current_lease, request_scope
from millm.store.database import Store, database_url
from millm.store.settings import get_setting, set_setting
from tests.support import model_dirs
from tests.support.postgres import PostgresServer, binaries


def source(directory, tmp_path):
    return resolve_source(str(directory), tmp_path / "hub")


# checkpoint inspection ----------------------------------------------------------------------------
def test_inspect_counts_what_the_safetensors_library_reads(tiny_dirs, tmp_path):
    checkpoint = inspect(source(tiny_dirs["llama"], tmp_path))
    assert checkpoint.parameters == model_dirs.parameters(tiny_dirs["llama"])
    assert checkpoint.stored_bytes == (tiny_dirs["llama"] / "model.safetensors").stat().st_size
    assert checkpoint.config["model_type"] == "llama" and checkpoint.quantization is None


def test_inspect_a_huge_sparse_checkpoint_reads_no_data(tiny_dirs, tmp_path):
    huge = model_dirs.huge(tiny_dirs["llama"], tmp_path / "huge", elements=2**38)
    assert inspect(source(huge, tmp_path)).parameters == 2**38


def _bad_header(directory):
    (directory / "model.safetensors").write_bytes(b"not a safetensors file")


def _header_lies(directory):
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 32]}}).encode()
    (directory / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0" * 32
    )


def _index_names_a_missing_shard(directory):
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00002-of-00002.safetensors"}})
    )


def _config_is_a_list(directory):
    (directory / "config.json").write_text("[1, 2]")


@pytest.mark.parametrize(
    "spoil, words",
    [
        (model_dirs.truncate, "is truncated: the file has"),
        (
            lambda d: model_dirs.truncate(d, keep=0.001),
            "bytes, not the size its header describes",
        ),  # cut inside the header
        (
            lambda d: (d / "model.safetensors").open("ab").write(b"\0" * 8),
            "is truncated: the file has",
        ),  # bytes past its data
        (_bad_header, "is not a valid safetensors file (header too large)"),
        (
            _header_lies,
            "is not a valid safetensors file (invalid shape, data type, or offset for tensor)",
        ),
        (
            _index_names_a_missing_shard,
            "lacks weight files its model.safetensors.index.json names: model-00002-of-00002",
        ),
        (_config_is_a_list, "config.json in"),
        (lambda d: (d / "config.json").write_text("{ nope"), "is not valid JSON"),
        (lambda d: (d / "model.safetensors").unlink(), "has no weight files"),
    ],
)
def test_inspect_names_what_is_broken(tiny_dirs, tmp_path, spoil, words):
    directory = model_dirs.copy_of(tiny_dirs["llama"], tmp_path / "model")
    resolved = source(directory, tmp_path)
    spoil(directory)
    with pytest.raises(ModelSourceError) as caught:
        inspect(resolved)
    assert words in str(caught.value)


def write_gguf(path):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_token_list(["a", "bb", "ccc"])  # an array of strings: the parser must walk it
    writer.add_tensor("dense", np.ones((4, 8), dtype=np.float32))
    writer.add_tensor(
        "quantized",
        gguf.quants.quantize(np.ones((2, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_tensor_table_matches_the_gguf_library(tmp_path):
    path = write_gguf(tmp_path / "m.gguf")
    checkpoint = inspect(source(path, tmp_path))
    assert (
        checkpoint.parameters
        == sum(int(t.n_elements) for t in gguf.GGUFReader(str(path)).tensors)
        == 32 + 128
    )
    assert checkpoint.config == {}


@pytest.mark.parametrize(
    "spoil, words",
    [
        (
            lambda data: data[:-40],
            r"is not a whole GGUF file \(truncated or corrupt: ",
        ),  # the last tensor's data cut short
        (
            lambda data: data[:200],
            r"is not a whole GGUF file \(truncated or corrupt: ",
        ),  # cut inside the metadata
        (lambda data: b"GGML" + data[4:], "is not a GGUF file$"),
        (lambda data: b"", "is not a GGUF file$"),
    ],
)
def test_gguf_files_that_are_not_whole(tmp_path, spoil, words):
    path = write_gguf(tmp_path / "m.gguf")
    resolved = source(path, tmp_path)
    assert inspect(resolved).parameters == 160  # read whole first: a changed file is read again
    path.write_bytes(spoil(path.read_bytes()))
    with pytest.raises(ModelSourceError, match=words):
        inspect(resolved)


# quantization and memory --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "quantization, words",
    [
        (
            {"quant_method": "gptq", "bits": 2, "group_size": 128},
            "gptq 2-bit, which this server cannot run: 2-bit and narrower",
        ),
        ({"quant_method": "aqlm", "weight_bits": 1}, "aqlm 1-bit"),
        (
            {"load_in_4bit": True},
            "bitsandbytes 4-bit, which this server cannot run: miLLM's engine runs float weights",
        ),
        ({"quant_method": "awq", "bits": 4}, "awq 4-bit"),
        ({"quant_method": "fp8"}, "quantized as fp8,"),
        ("int4", "quantization_config that is not an object"),
    ],
)
def test_quantized_transformers_checkpoints_are_refused(quantization, words):
    with pytest.raises(UnsupportedQuantization) as caught:
        check_quantization("m", Checkpoint(10, 40, {"quantization_config": quantization}))
    assert (
        words in caught.value.message
        and caught.value.status == 400
        and caught.value.param == "model"
    )


def test_float_checkpoints_and_gguf_files_pass_the_quantization_check():
    check_quantization("m", Checkpoint(10, 40, {"torch_dtype": "bfloat16"}))
    check_quantization("m", Checkpoint(10, 40, {"quantization_config": None}))
    check_quantization("m", Checkpoint(10, 40, {}))


@pytest.mark.parametrize(
    "needed, free, reclaimable, limit, fits",
    [
        (100, 100, 0, None, True),
        (101, 100, 0, None, False),
        (150, 100, 50, None, True),  # the loaded model's memory comes back before the load
        (150, 100, 50, 149, False),  # the cap holds even when the device has room
        (150, 1000, 0, 150, True),
    ],
)
def test_the_memory_rule(needed, free, reclaimable, limit, fits):
    assert DeviceMemory("cpu", needed, free, reclaimable, limit).fits is fits


def test_check_memory_reports_the_figures_of_the_device():
    import psutil
    import torch

    fitting = check_memory("m", 1000, torch.device("cpu"), 0, None, None)
    assert fitting.fits and fitting.free_bytes > 1000
    with pytest.raises(InsufficientMemoryToLoad) as caught:
        check_memory("m", 2**50, torch.device("cpu"), 123, 10**6, "old")
    error = caught.value
    assert (error.status, error.code) == (503, "insufficient_memory")
    [figures] = error.to_dict()["devices"]
    assert (
        figures["needed_bytes"] == 2**50
        and figures["reclaimable_bytes"] == 123
        and figures["limit_bytes"] == 10**6
    )
    assert 0 < figures["free_bytes"] <= psutil.virtual_memory().total
    assert (
        "cpu has" in error.message
        and "MILLM_MEMORY_LIMIT_BYTES caps" in error.message
        and "'old' stays loaded" in error.message
    )


# the registry -------------------------------------------------------------------------------------
def test_registrations_persist_and_refuse_clashes(tiny_dirs, tmp_path):
    url = database_url(tmp_path, None)
    store = Store(url)
    registry = ModelRegistry(store, tmp_path / "hub")
    entry, created = registry.register(str(tiny_dirs["gemma2"]), None)
    assert created and entry.name == "tiny-gemma2" and entry.reference == str(tiny_dirs["gemma2"])
    assert entry.info["parameters"] == model_dirs.parameters(tiny_dirs["gemma2"])
    assert registry.register(str(tiny_dirs["gemma2"]), None) == (entry, False)
    with pytest.raises(Conflict) as clash:
        registry.register(str(tiny_dirs["llama"]), "tiny-gemma2")
    assert clash.value.code == "model_exists"
    other, _ = registry.register(str(tiny_dirs["llama"]), "second")
    store.close()

    again = ModelRegistry(Store(url), tmp_path / "hub")
    assert [e.name for e in again.all()] == ["tiny-gemma2", "second"]
    assert again.get("second") == other and again.source("second").directory == tiny_dirs["llama"]
    again.forget("second")
    with pytest.raises(ModelNotFound, match="registered: 'tiny-gemma2'"):
        again.get("second")
    again.store.close()


def test_registration_refusals(tiny_dirs, tmp_path):
    store = Store(database_url(tmp_path, None))
    registry = ModelRegistry(store, tmp_path / "hub")
    garbage = model_dirs.garbage_config(tiny_dirs["llama"], tmp_path / "garbage")
    for reference in (
        str(garbage),
        str(tmp_path / "missing"),
        str(tiny_dirs["llama"] / "config.json"),
    ):
        with pytest.raises(InvalidRequest) as caught:
            registry.register(reference, None)
        assert caught.value.code == "invalid_model_source" and reference in caught.value.message
    for name in ("", " padded", "x" * 201, "tab\there"):
        with pytest.raises(InvalidRequest, match="is not usable"):
            registry.register(str(tiny_dirs["llama"]), name)
    assert registry.all() == []
    store.close()


def test_a_relative_reference_is_stored_as_an_absolute_path(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_dirs["llama"].parent)
    store = Store(database_url(tmp_path, None))
    entry, _ = ModelRegistry(store, tmp_path / "hub").register(tiny_dirs["llama"].name, None)
    assert entry.reference == str(tiny_dirs["llama"])
    store.close()


def test_the_start_up_model_is_registered_and_follows_the_operator(tiny_dirs, tmp_path):
    store = Store(database_url(tmp_path, None))
    registry = ModelRegistry(store, tmp_path / "hub")
    first = registry.ensure("served", source(tiny_dirs["llama"], tmp_path))
    assert registry.ensure("served", source(tiny_dirs["llama"], tmp_path)) == first
    moved = registry.ensure("served", source(tiny_dirs["gemma2"], tmp_path))
    assert (
        moved.reference == str(tiny_dirs["gemma2"]) and moved.registered_at == first.registered_at
    )
    store.close()


@pytest.mark.skipif(binaries() is None, reason="PostgreSQL binaries are not installed")
def test_registrations_on_postgres(tiny_dirs, tmp_path):
    postgres = PostgresServer()
    try:
        store = Store(postgres.url)
        entry, _ = ModelRegistry(store, tmp_path / "hub").register(
            str(tiny_dirs["llama"]), "pg-model"
        )
        set_setting(store, "model_lock", "pg-model")
        store.close()
        again = Store(postgres.url)
        assert ModelRegistry(again, tmp_path / "hub").get("pg-model") == entry
        assert get_setting(again, "model_lock") == "pg-model"
        again.close()
    finally:
        postgres.stop()


# the slot's leases --------------------------------------------------------------------------------
@pytest.fixture
def filled(llama_lm):
    slot = ModelSlot()
    scheduler = Scheduler(llama_lm, 4)
    slot.fill(llama_lm, scheduler)
    yield slot, llama_lm
    scheduler.shutdown(timeout=30)


def embed(slot, lease):
    events = []
    done = threading.Event()
    job = EmbeddingJob(prompts=[[1, 5, 6]], emit=lambda e: (events.append(e), done.set()))
    admitted = slot.submit(lease, job)
    if admitted:
        assert done.wait(30)
    return admitted, events


def test_a_lease_needs_a_request_scope_and_names_the_loaded_model(filled):
    slot, lm = filled
    with pytest.raises(RuntimeError, match="request scope"):
        slot.lease(lm.name)
    with request_scope(slot):
        assert slot.lease("another-model") is None
        lease = slot.lease(lm.name)
        assert lease.lm is lm and current_lease() is lease and slot.leases == 1
        admitted, events = embed(slot, lease)
        assert admitted and isinstance(events[0], EmbeddingsReady)
    assert slot.leases == 0 and lease.released and current_lease() is None


def test_an_unload_waits_for_leases_and_held_ones_stop_at_stop_serving(filled):
    slot, lm = filled
    inside, leave = threading.Event(), threading.Event()

    def request():
        with request_scope(slot):
            slot.lease(lm.name)
            inside.set()
            leave.wait(30)

    holder = threading.Thread(target=request)
    holder.start()
    assert inside.wait(30)
    slot.close()
    with request_scope(slot):
        assert slot.lease(lm.name) is None  # closed: no new lease
    began = time.monotonic()
    assert slot.drain(0.2) is False and time.monotonic() - began >= 0.2
    threading.Timer(0.2, leave.set).start()
    assert slot.drain(30) is True
    holder.join(30)


def test_a_lease_from_before_stop_serving_cannot_submit(filled):
    slot, lm = filled
    with request_scope(slot):
        lease = slot.lease(lm.name)
        slot.close()
        assert embed(slot, lease)[0] is True  # closing stops new leases, not the held one
        slot.stop_serving()
        assert embed(slot, lease) == (False, [])
    taken, scheduler = slot.empty()
    assert taken is lm and slot.lm is None and slot.leases == 0
    slot.fill(lm, scheduler)  # a later fill: the old lease stays refused, a new one serves
    assert embed(slot, lease) == (False, [])
    with request_scope(slot):
        fresh = slot.lease(lm.name)
        admitted, events = embed(slot, fresh)
        assert admitted and not any(isinstance(e, JobFailed) for e in events)
    assert fresh.released and embed(slot, fresh) == (False, [])  # it ended with its request
