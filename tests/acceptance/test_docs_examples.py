"""The curl and SDK examples in README.md and docs/ run against the demo model, so the docs stay true.

They run on a server of their own (sharing the demo server's converted checkpoint), because
some examples change steering state. An example preceded by `<!-- example: error -->` is
expected to answer with an error body.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.server import ServerProcess

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(<!-- example: error -->\n)?```(python|bash)\n(.*?)```", re.S)
BASE = "http://127.0.0.1:8000"


def examples():
    for path in DOCS:
        for number, (marker, language, code) in enumerate(FENCE.findall(path.read_text())):
            if BASE not in code:
                continue
            yield pytest.param(language, code, bool(marker), id=f"{path.name}-{number}-{language}")


@pytest.fixture(scope="module")
def docs_server(demo_server, tmp_path_factory):
    home = tmp_path_factory.mktemp("docs-home")
    shutil.copytree(demo_server.log_path.parent / "cache", home / "cache")
    server = ServerProcess(home, [])
    try:
        yield server.wait_ready(timeout=600)
    finally:
        server.stop()


@pytest.mark.parametrize("language, code, expect_error", list(examples()))
def test_example_runs(docs_server, language, code, expect_error):
    code = code.replace(BASE, docs_server.base_url)
    if language == "python":
        exec(compile(code, "<docs example>", "exec"), {})
        return
    result = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert ('"error"' in result.stdout) == expect_error, result.stdout
