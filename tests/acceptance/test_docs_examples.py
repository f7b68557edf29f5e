"""The curl and SDK examples in README.md and docs/ run against the demo model, so the docs stay true."""

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"```(python|bash)\n(.*?)```", re.S)
BASE = "http://127.0.0.1:8000"


def examples():
    for path in DOCS:
        for number, (language, code) in enumerate(FENCE.findall(path.read_text())):
            if language == "python" and "OpenAI(" in code:
                yield pytest.param(language, code, id=f"{path.name}-{number}-python")
            elif language == "bash" and code.lstrip().startswith("curl"):
                yield pytest.param(language, code, id=f"{path.name}-{number}-curl")


@pytest.mark.parametrize("language, code", list(examples()))
def test_example_runs(demo_server, language, code):
    code = code.replace(BASE, demo_server.base_url)
    if language == "python":
        exec(compile(code, "<docs example>", "exec"), {})
    else:
        result = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert '"error"' not in result.stdout, result.stdout
        assert '"choices"' in result.stdout
