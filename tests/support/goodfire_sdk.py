"""The `goodfire` SDK (0.3.5, from PyPI, unmodified) driven from its own environment
(.venv-goodfire, made by scripts/setup.sh: it pins httpx below 0.28, which millm's clients
outgrew): a script run there against a live server, its last line of output read as JSON; and
the SDK's own README, its Python blocks as the package ships them."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-goodfire" / "bin" / "python"
PRELUDE = """
import json
import goodfire
client = goodfire.Client(api_key="not-needed", base_url={base!r})
MODEL = {model!r}
def emit(value):
    print(json.dumps(value))
"""


def run_sdk(base_url: str, model: str, code: str, timeout: float = 600) -> dict | list:
    """Run `code` with `client` and `MODEL` set, in the SDK's environment; what it `emit`s last."""
    script = PRELUDE.format(base=base_url, model=model) + textwrap.dedent(code)
    done = subprocess.run(
        [str(PYTHON), "-c", script], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def readme_blocks() -> list[tuple[str, str]]:
    """(title, code) of each Python block in the README the installed SDK ships (its METADATA)."""
    found = subprocess.run(
        [
            str(PYTHON),
            "-c",
            "import importlib.metadata as m; print(m.metadata('goodfire').get_payload())",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        (title.strip(), code)
        for title, code in re.findall(r"```python([^\n]*)\n(.*?)```", found, flags=re.S)
    ]
