"""Acceptance: the `goodfire` SDK's own README (as the 0.3.5 package ships it), its Python blocks
run in order against the demo server, adapted only in the model's name and the base URL."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.api.clients import finished_job
from tests.support.goodfire_sdk import readme_blocks, run_sdk

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
MODEL = "SmolLM2-135M-Instruct"
SAE = "sae_262743630f92"
ITS_MODEL = "meta-llama/Llama-3.3-70B-Instruct"
ITS_BASE = "https://api.goodfire.ai"
# The README's AutoConditional block calls goodfire.conditional.AutoConditional, which SDK 0.3.5
# does not have (AttributeError on Goodfire's own service too); the SDK's own
# client.features.AutoConditional is run in test_goodfire_sdk.py.
BROKEN_IN_THE_SDK = {"Auto Conditional Code"}


def adapted(code: str, base_url: str) -> str:
    """The block with the demo's model name and this server's URL; a notebook's last expression
    printed as the notebook shows it."""
    code = code.replace(ITS_MODEL, MODEL).replace(ITS_BASE, base_url)
    code = code.replace(
        "goodfire.Client(api_key=GOODFIRE_API_KEY)",
        f"goodfire.Client(api_key=GOODFIRE_API_KEY, base_url={base_url!r})",
    )
    tree = ast.parse(code)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.Expr(
            ast.Call(ast.Name("print", ast.Load()), [last.value], [])  # type: ignore[arg-type]
        )
        code = ast.unparse(ast.fix_missing_locations(tree))
    return code


def test_the_sdks_readme_runs_on_the_demo(demo_server):
    # Ember searched by meaning: on millm that needs the SAE's label embeddings, made once.
    made = httpx.post(f"{demo_server.base_url}/api/saes/{SAE}/labels/embeddings", timeout=60)
    assert made.status_code == 202, made.text
    assert finished_job(demo_server, made.json()["id"], timeout=600)["state"] == "succeeded"
    blocks = [
        (title, adapted(code, demo_server.base_url))
        for title, code in readme_blocks()
        if not code.lstrip().startswith("!") and title not in BROKEN_IN_THE_SDK
    ]
    assert len(blocks) == 30
    script = "\nran = []\n"
    for title, code in blocks:
        script += f"{code}\nran.append({title!r})\n"
    script += "emit(ran)\n"
    ran = run_sdk(demo_server.base_url, MODEL, script, timeout=900)
    assert ran == [title for title, _ in blocks]  # each in order, none stopped by an error


def test_the_coming_from_ember_page_runs(demo_server):
    page = (ROOT / "docs" / "ember.md").read_text()
    examples = re.findall(r"<!-- example: goodfire -->\n```python\n(.*?)```", page, flags=re.S)
    assert len(examples) == 2
    printed = []
    for code in examples:
        code = code.replace("http://127.0.0.1:8000", demo_server.base_url)
        script = (
            "import contextlib, io\n_out = io.StringIO()\nwith contextlib.redirect_stdout(_out):\n"
            + textwrap.indent(code, "    ")
            + "\nemit(_out.getvalue())\n"
        )
        printed.append(run_sdk(demo_server.base_url, MODEL, script))
    # what the page promises: the pirate feature found first, a steered answer, the abort
    first = printed[0].splitlines()
    assert first[1] == '   0: "pirate / pirates / ates",' and len(first[5]) > 40
    assert first[-1] == "aborted: the pirate feature passed half its peak"
    assert printed[1].startswith('Token(" pirate") FeatureActivations(')
    assert "pirate / pirates / ates" in printed[1]
