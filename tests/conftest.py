"""Shared fixtures: tiny checkpoints built once per session, in-process models and live servers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import server as server_support
from tests.support import tiny_models
from tests.support.browser import SIZES, PageErrors, browser
from tests.support.model_cache import start_sharing
from tests.support.postgres import PostgresServer, binaries
from tests.support.server import ServerProcess

TINY_NAME = "tiny-llama"


def share_the_cores() -> int | None:
    """Under pytest-xdist, each worker and every server it starts take their share of the cores
    (cores / workers OpenMP threads). With two workers of two threads each on two cores, threads
    spin against each other: the documented evaluation took 185 s beside a copy of itself, 70 s
    with one thread each, 45 s alone. An OMP_NUM_THREADS the caller set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2 or "OMP_NUM_THREADS" in os.environ:
        return None
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)  # servers and the zygote inherit it
    import torch

    torch.set_num_threads(threads)
    return threads


share_the_cores()

# Property tests draw the same examples on every run (reproducible CI, no example database
# written into the tree) and have no per-example deadline (the machine is shared and busy).
settings.register_profile("millm", derandomize=True, database=None, deadline=None, max_examples=100)
settings.load_profile("millm")


@pytest.fixture(scope="session", autouse=True)
def test_root(tmp_path_factory) -> Path:
    """Everything tests build lives under pytest's base temporary folder: servers may read it
    (MILLM_ALLOWED_PATHS)."""
    server_support.TEST_ROOT = tmp_path_factory.getbasetemp()
    return server_support.TEST_ROOT


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """Tokenizer and checkpoints: llama, gemma2, and llama without a chat template."""
    base = tmp_path_factory.mktemp("tiny")
    tiny_models.build_tokenizer(base / "tokenizer")
    tiny_models.build_tokenizer(base / "tokenizer-plain", chat_template=None)
    return {
        "tokenizer": base / "tokenizer",
        "llama": tiny_models.build_llama(base / TINY_NAME, base / "tokenizer"),
        "gemma2": tiny_models.build_gemma2(base / "tiny-gemma2", base / "tokenizer"),
        "llama-plain": tiny_models.build_llama(base / "tiny-llama-plain", base / "tokenizer-plain"),
    }


def load_tiny(directory: Path, home: Path, engine: str = "transformers", **kwargs):
    """An in-process LoadedModel of a tiny checkpoint (float32; transformers on the CPU, or
    llama.cpp)."""
    from millm.engine.loader import load_model
    from millm.engine.loader_llamacpp import load_with_llamacpp
    from millm.engine.sources import resolve_source

    source = resolve_source(str(directory), home / "hub")
    if engine == "llama.cpp":
        return load_with_llamacpp(source, dtype="float32", cache_root=home / "cache", **kwargs)
    return load_model(source, dtype="float32", device="cpu", cache_root=home / "cache", **kwargs)


@pytest.fixture(scope="session")
def llama_lm(tiny_dirs, tmp_path_factory):
    """The tiny Llama, loaded in this process."""
    return load_tiny(tiny_dirs["llama"], tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="session")
def tiny_gguf(tiny_dirs, tmp_path_factory) -> Path:
    """The tiny Llama written as GGUF files beside each other: tiny-llama.F32.gguf (the same weights
    exactly) and tiny-llama.Q8_0.gguf, in one folder; returns the F32 file."""
    from tests.support.tiny_gguf import write_llama_gguf

    folder = tmp_path_factory.mktemp("tiny-gguf")
    write_llama_gguf(tiny_dirs["llama"], folder / "tiny-llama.Q8_0.gguf", "Q8_0")
    return write_llama_gguf(tiny_dirs["llama"], folder / "tiny-llama.F32.gguf", "F32")


@pytest.fixture(scope="session")
def cpp_lm(tiny_gguf, tmp_path_factory):
    """The tiny Llama's F32 GGUF file on llama.cpp, in this process (float32 keys and values)."""
    return load_tiny(tiny_gguf, tmp_path_factory.mktemp("home"), engine="llama.cpp", sequences=16)


@pytest.fixture(scope="session")
def gemma2_lm(tiny_dirs, tmp_path_factory):
    """The tiny Gemma2, loaded in this process."""
    return load_tiny(tiny_dirs["gemma2"], tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="session")
def llama_server(tiny_dirs, tmp_path_factory):
    """A live server on the tiny Llama (context 128 tokens)."""
    server = ServerProcess(
        tmp_path_factory.mktemp("server-home"), ["--model", str(tiny_dirs["llama"])]
    )
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory):
    """A live server on the demo model, started exactly as the README does (no --model); its
    converted checkpoint is kept between runs (tests/support/model_cache.py)."""
    server = start_sharing("demo", tmp_path_factory.mktemp("demo-home"), [])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium per test module. Not one per session: Playwright's sync API keeps an
    event loop running on the main thread while it is open, and later tests call asyncio.run()."""
    with browser() as instance:
        yield instance


@pytest.fixture(params=["wide"])
def page(request, chromium):
    """A fresh page (own storage) at 1280×800; the test fails if the page threw an uncaught
    error."""
    context = chromium.new_context(viewport=SIZES[request.param])
    page = context.new_page()
    page.set_default_timeout(20_000)
    errors = PageErrors().watch(page)
    try:
        yield page
    finally:
        context.close()
    assert not errors, errors


@pytest.fixture
def shoot():
    """`shoot(page, name)` saves a screenshot when MILLM_UI_SCREENSHOTS names a folder
    (scripts/workbench-screenshots)."""
    folder = os.environ.get("MILLM_UI_SCREENSHOTS")

    def take(page, name: str) -> None:
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=False)

    return take


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster for one module (skipped where the server binaries are
    missing)."""
    if binaries() is None:
        pytest.skip("PostgreSQL binaries are not installed")
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test its own node id: schemathesis gives each operation's test the function's id (its
    name says the operation), and pytest-xdist, which ./scripts/test runs, tells tests apart by
    id."""
    for item in items:
        if not item.nodeid.endswith(item.name):
            item._id = (
                f"{item.nodeid.rpartition('::')[0]}::{item.name}"  # pytest 9 keeps the id here
            )


# Skips this suite expects on some machines, by the start of their reason; any other skip fails the
# run (a test that silently stops running is a test lost). docs/testing.md keeps the list's rule.
KNOWN_SKIPS = {
    "this CPU has no AVX-512": "on an AVX2-only CPU the whole suite is what the AVX2 slice "
    "emulates",
    "oneDNN cannot pre-pack": "a CPU without AVX-512 or AVX-NE-CONVERT has no bf16 pre-packed "
    "kernel to test",
    "bf16 pre-packing needs": "the same, for the bf16 kernel plan",
    "the spec is not at": "a clone outside the workplace has no ../shared/spec to check the "
    "errors table against",
}
unknown_skips: list[str] = []


def pytest_runtest_logreport(report):
    """Collect skips whose reason is not a known one."""
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(
            report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        ).removeprefix("Skipped: ")
        if not reason.startswith(tuple(KNOWN_SKIPS)):
            unknown_skips.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session):
    """A run with an unknown skip fails, whatever else passed."""
    if unknown_skips and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    """Name the unknown skips that failed the run."""
    if unknown_skips:
        terminalreporter.section(
            "skips that are not known (tests/conftest.py KNOWN_SKIPS)", red=True
        )
        for line in unknown_skips:
            terminalreporter.line(line)
