"""The curl and SDK examples in README.md and docs/ run against the demo model, so the docs stay true.

They run on a server of their own (sharing the demo server's converted checkpoint), because
some examples change steering state. An example preceded by `<!-- example: error -->` is
expected to answer with an error body; one preceded by `<!-- example: keyed -->` (or
`keyed error`) runs against a server started with an API key and an admin key, read from
`~/.millm-api-key` and `~/.millm-admin-key` as docs/serving.md sets them up, with HOME
pointing at a folder that holds them.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.server import ServerProcess

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- example: ([a-z ]+) -->\n)?```(python|bash)\n(.*?)```", re.S)
BASE = "http://127.0.0.1:8000"


def examples():
    for path in DOCS:
        for number, (marker, language, code) in enumerate(FENCE.findall(path.read_text())):
            if BASE not in code:
                continue
            flags = marker.split()
            yield pytest.param(language, code, "error" in flags, "keyed" in flags, id=f"{path.name}-{number}-{language}")


@pytest.fixture(scope="module")
def docs_server(demo_server, tmp_path_factory):
    home = tmp_path_factory.mktemp("docs-home")
    shutil.copytree(demo_server.log_path.parent / "cache", home / "cache")
    server = ServerProcess(home, [])
    try:
        yield server.wait_ready(timeout=600)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def keyed_home(tmp_path_factory):
    """A HOME holding the two key files docs/serving.md makes."""
    home = tmp_path_factory.mktemp("user-home")
    (home / ".millm-api-key").write_text("sk-docs-api-0123456789\n")
    (home / ".millm-admin-key").write_text("sk-docs-admin-0123456789\n")
    return home


@pytest.fixture(scope="module")
def keyed_server(demo_server, keyed_home, tmp_path_factory):
    home = tmp_path_factory.mktemp("keyed-docs-home")
    shutil.copytree(demo_server.log_path.parent / "cache", home / "cache")
    env = {"MILLM_API_KEY_FILE": str(keyed_home / ".millm-api-key"), "MILLM_ADMIN_KEY_FILE": str(keyed_home / ".millm-admin-key")}
    server = ServerProcess(home, [], env=env)
    try:
        yield server.wait_ready(timeout=600)
    finally:
        server.stop()


@pytest.mark.parametrize("language, code, expect_error, keyed", list(examples()))
def test_example_runs(request, monkeypatch, language, code, expect_error, keyed):
    server = request.getfixturevalue("keyed_server" if keyed else "docs_server")
    environment = None
    if keyed:
        monkeypatch.setenv("HOME", str(request.getfixturevalue("keyed_home")))
        environment = dict(os.environ)
    code = code.replace(BASE, server.base_url)
    if language == "python":
        exec(compile(code, "<docs example>", "exec"), {})
        return
    result = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 0, result.stderr
    assert ('"error"' in result.stdout) == expect_error, result.stdout
