"""The curl and SDK examples in README.md and docs/ run against the demo model, so the docs stay true.

They run on a server of their own (sharing the demo server's converted checkpoint), because
some examples change steering state. An example preceded by `<!-- example: error -->` is
expected to answer with an error body; one preceded by `<!-- example: keyed -->` (or
`keyed error`) runs against a server started with an API key and an admin key, read from
`~/.millm-api-key` and `~/.millm-admin-key` as docs/serving.md sets them up, with HOME
pointing at a folder that holds them.

What a Python example prints is checked wherever the docs show it, in one of two forms:
- a comment at the end of a one-line `print(...)` call: `print(x)  # what it prints`; every line
  that call writes must read so;
- a fence with no language right after the example (only blank lines between): the example's
  whole output, line for line. Greedy bf16 text can differ between CPU kinds (their bf16 matmul
  kernels differ: AVX-512 on AMD Zen 4, AMX on recent Intel Xeons), so such a fence may be
  followed by alternatives, each a line `*Printed on <which CPU> ...:*` and its own fence; the
  output must then read as one of them.
Lines are compared after collapsing runs of whitespace, with two allowances for values that
vary from run to run: generated ids (`chatcmpl-…`, `cmpl-…`, `call_…`, `resp_…`, `msg_…`, `fc_…`) match any id of their
kind, and a decimal number matches within 1 in its last shown digit plus 2% (activations and
logprobs move a little between machines); whole numbers (indices, positions, counts) and all
other text must be equal. Output the docs show only in prose or tables (README's steering
table) is not checked; the example must still run without raising. A curl example must exit 0
and answer with an error body exactly when marked `error`; the JSON the docs show after one is
an illustration (ids, times, live counters) and is not compared.
"""

import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from tests.support.server import ServerProcess

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- example: ([a-z ]+) -->\n)?```(python|bash)\n(.*?)```", re.S)
OUTPUT_BLOCK = re.compile(r"\s*```\n(.*?)```", re.S)  # a fence with no language, right after the example
ALTERNATIVE = re.compile(r"\s*\*Printed on [^\n]*:\*\n\s*```\n(.*?)```", re.S)  # the same output on another CPU kind
BASE = "http://127.0.0.1:8000"
GENERATED_ID = re.compile(r"\b(chatcmpl-|cmpl-|call_|resp_|msg_|fc_)[0-9a-f]+\b")
NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")


def examples():
    for path in DOCS:
        text = path.read_text()
        for number, match in enumerate(FENCE.finditer(text)):
            marker, language, code = match.groups(default="")
            if BASE not in code:
                continue
            flags = marker.split()
            shown = OUTPUT_BLOCK.match(text, match.end()) if language == "python" else None
            output = None
            if shown:
                output = [shown.group(1)]
                while other := ALTERNATIVE.match(text, shown.end()):
                    output.append(other.group(1))
                    shown = other
            yield pytest.param(language, code, output, "error" in flags, "keyed" in flags, id=f"{path.name}-{number}-{language}")


def print_comments(code: str) -> dict[int, str]:
    """Line number -> the comment ending a one-line `print(...)` call on that line."""
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT and token.line.lstrip().startswith("print("):
            comments[token.start[0]] = token.string[1:].strip()
    return comments


def same_line(shown: str, printed: str) -> bool:
    """Whether a printed line reads as the docs show it (the rule in the module docstring)."""
    shown, printed = (GENERATED_ID.sub(r"\1ID", " ".join(line.split())) for line in (shown, printed))
    if NUMBER.sub("#", shown) != NUMBER.sub("#", printed):  # the text around the numbers, and their count
        return False
    for want, got in zip(NUMBER.finditer(shown), NUMBER.finditer(printed), strict=True):
        if want.group(1) is None or got.group(1) is None:
            if want.group() != got.group():
                return False
        elif abs(float(want.group()) - float(got.group())) > 10 ** -len(want.group(1)) + 0.02 * abs(float(want.group())):
            return False
    return True


def run_python(code: str) -> tuple[str, list[tuple[int, str]]]:
    """Run an example; its whole output and, per `print` call, (line number, what it wrote)."""
    calls: list[tuple[int, str]] = []
    whole = io.StringIO()

    def recording_print(*args, sep=" ", end="\n", file=None, flush=False):
        if file is not None and file is not sys.stdout:
            return print(*args, sep=sep, end=end, file=file, flush=flush)
        text = sep.join(map(str, args)) + end
        calls.append((sys._getframe(1).f_lineno, text))
        whole.write(text)

    exec(compile(code, "<docs example>", "exec"), {"print": recording_print})
    return whole.getvalue(), calls


def reads_as(shown: str, printed: str) -> bool:
    """Whether a whole output reads as a fence the docs show, line for line."""
    want, got = shown.splitlines(), printed.splitlines()
    return len(want) == len(got) and all(map(same_line, want, got))


def check_output(code: str, output: list[str] | None) -> None:
    """What the example printed against what the docs show after it (any of its CPU alternatives) and in its print comments."""
    printed, calls = run_python(code)
    if output is not None:
        assert any(reads_as(shown, printed) for shown in output), f"the docs show\n{chr(10).join(output)}\nit printed\n{printed}"
    for line, shown in print_comments(code).items():
        lines = [text for at, text in calls if at == line]
        assert lines, f"line {line} of the example never printed (the docs show {shown!r})"
        for text in lines:
            assert same_line(shown, text.rstrip("\n")), f"line {line}: the docs show {shown!r}, it printed {text!r}"


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


@pytest.mark.parametrize("language, code, output, expect_error, keyed", list(examples()))
def test_example_runs_and_prints_what_the_docs_show(request, monkeypatch, language, code, output, expect_error, keyed):
    server = request.getfixturevalue("keyed_server" if keyed else "docs_server")
    environment = None
    if keyed:
        monkeypatch.setenv("HOME", str(request.getfixturevalue("keyed_home")))
        environment = dict(os.environ)
    code = code.replace(BASE, server.base_url)
    if language == "python":
        check_output(code, output)
        return
    result = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=120, env=environment)
    assert result.returncode == 0, result.stderr
    assert ('"error"' in result.stdout) == expect_error, result.stdout
