"""The curl and SDK examples in README.md and docs/ run against the demo model, so the docs stay
true.

They run on a server of their own (sharing the demo server's converted checkpoint), because
some examples change steering state. An example preceded by `<!-- example: error -->` is
expected to answer with an error body; one preceded by `<!-- example: keyed -->` (or
`keyed error`) runs against a server started with an API key and an admin key, read from
`~/.millm-api-key` and `~/.millm-admin-key` as docs/serving.md sets them up, with HOME
pointing at a folder that holds them; one preceded by `<!-- example: reproducible -->` runs
against a server started with `--reproducible`, whose numbers are the same on every x86 CPU.
One preceded by `<!-- example: goodfire -->` uses the goodfire SDK, which lives in an
environment of its own: tests/acceptance/test_goodfire_readme.py runs it there.

No check here depends on the CPU kind (docs/testing.md, "Docs examples"). Greedy bf16 text and
the activations under it differ between CPU kinds (their bf16 kernels differ), so what a Python
example prints is checked in three ways:
- `<!-- check: EXPR -->` lines right after the example: each a Python expression, evaluated in the
  example's namespace after it ran (`printed` holds everything it printed, `lines` the same split
  into lines), that must be true. They state what the example promises: the fields, the status, that
  two endpoints gave the same text, that the steered answer differs and mentions what the profile is
  about, a number within its stated tolerance.
- A fence with no language after the example (and its checks): its whole output, line for
  line. That is only for output that does not depend on the model's arithmetic (labels, stored
  calibrations, counts, booleans) or for `reproducible` examples.
- The same fence labelled `*Printed on <which CPU> ...:*` is an illustration: it is not compared,
  and the example must carry checks. So is the comment ending a one-line `print(...)` call when it
  starts with `e.g.`; otherwise `print(x)  # what it prints` is compared, every line that call
  writes. Lines are compared after collapsing runs of whitespace, with two allowances for values
  that vary from run to run: generated ids (`chatcmpl-…`, `cmpl-…`, `call_…`, `resp_…`, `msg_…`,
  `fc_…`) match any id of their kind, and a decimal number matches within 1 in its last shown digit
  plus 2%; whole numbers (indices, positions, counts) and all other text must be equal. Output the
  docs show only in prose or tables (README's steering table) is not checked; the example must still
  run without raising. A curl example must exit 0 and answer with an error body exactly when marked
  `error`; the JSON the docs show after one is an illustration (ids, times, live counters) and is
  not compared.
"""

import io
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.support.model_cache import start_sharing

pytestmark = pytest.mark.acceptance
ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- example: ([a-z ]+) -->\n)?```(python|bash)\n(.*?)```", re.S)
CHECK = re.compile(r"\s*<!-- check: (.*?) -->", re.S)  # a promise, right after the example
# The output, after the checks: a fence with no language, or the same labelled as an illustration.
OUTPUT_BLOCK = re.compile(r"\s*(\*Printed on [^\n]*:\*\n\s*)?```\n(.*?)```", re.S)
ILLUSTRATION = "e.g."  # a print comment starting so is not compared
BASE = "http://127.0.0.1:8000"
GENERATED_ID = re.compile(r"\b(chatcmpl-|cmpl-|call_|resp_|msg_|fc_)[0-9a-f]+\b")
NUMBER = re.compile(r"-?\d+(?:\.(\d+))?")
ERROR_BODY = re.compile(r'"error":\s*\{')


def examples():
    for path in DOCS:
        text = path.read_text()
        for number, match in enumerate(FENCE.finditer(text)):
            marker, language, code = match.groups(default="")
            if BASE not in code:
                continue
            flags = marker.split()
            if "goodfire" in flags:
                continue  # the goodfire SDK's examples run in its own environment (ember.md)
            checks, end = [], match.end()
            while check := CHECK.match(text, end):
                checks.append(check.group(1).strip())
                end = check.end()
            shown = OUTPUT_BLOCK.match(text, end) if language == "python" else None
            example = Example(
                language,
                code,
                checks,
                shown.group(2) if shown else None,
                bool(shown and shown.group(1)),
                set(flags),
            )
            yield pytest.param(example, id=f"{path.name}-{number}-{language}")


@dataclass(frozen=True)
class Example:
    """One runnable example, the promises it carries and the output the docs show after it."""

    language: str
    code: str
    checks: list[str]
    output: str | None  # the fence after the example
    illustration: bool  # that fence is labelled "Printed on ...": shown, not compared
    flags: set[str]

    @property
    def server(self) -> str:
        """The fixture of the server it runs against."""
        return (
            "keyed_server"
            if "keyed" in self.flags
            else "reproducible_server"
            if "reproducible" in self.flags
            else "docs_server"
        )

    def unchecked(self) -> bool:
        """Whether it shows output only as illustrations and states no promise to check instead."""
        illustrated = self.illustration or any(
            c.startswith(ILLUSTRATION) for c in print_comments(self.code).values()
        )
        return illustrated and not self.checks

    def exact_comments(self) -> dict[int, str]:
        """Print comments compared as they read."""
        return {
            line: shown
            for line, shown in print_comments(self.code).items()
            if not shown.startswith(ILLUSTRATION)
        }


def print_comments(code: str) -> dict[int, str]:
    """Line number -> the comment ending a one-line `print(...)` call on that line."""
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT and token.line.lstrip().startswith("print("):
            comments[token.start[0]] = token.string[1:].strip()
    return comments


def same_line(shown: str, printed: str) -> bool:
    """Whether a printed line reads as the docs show it (the rule in the module docstring)."""
    shown, printed = (
        GENERATED_ID.sub(r"\1ID", " ".join(line.split())) for line in (shown, printed)
    )
    if NUMBER.sub("#", shown) != NUMBER.sub(
        "#", printed
    ):  # the text around the numbers, and their count
        return False
    for want, got in zip(NUMBER.finditer(shown), NUMBER.finditer(printed), strict=True):
        if want.group(1) is None or got.group(1) is None:
            if want.group() != got.group():
                return False
        elif abs(float(want.group()) - float(got.group())) > 10 ** -len(want.group(1)) + 0.02 * abs(
            float(want.group())
        ):
            return False
    return True


def run_python(code: str) -> tuple[str, list[tuple[int, str]], dict]:
    """Run an example; its whole output, per `print` call (line number, what it wrote), and its
    namespace."""
    calls: list[tuple[int, str]] = []
    whole = io.StringIO()

    def recording_print(*args, sep=" ", end="\n", file=None, flush=False):
        if file is not None and file is not sys.stdout:
            return print(*args, sep=sep, end=end, file=file, flush=flush)
        text = sep.join(map(str, args)) + end
        calls.append((sys._getframe(1).f_lineno, text))
        whole.write(text)

    namespace = {"print": recording_print}
    exec(compile(code, "<docs example>", "exec"), namespace)
    return whole.getvalue(), calls, namespace


def reads_as(shown: str, printed: str) -> bool:
    """Whether a whole output reads as a fence the docs show, line for line."""
    want, got = shown.splitlines(), printed.splitlines()
    return len(want) == len(got) and all(map(same_line, want, got))


def check_output(example: Example) -> None:
    """The example's promises, and what it printed against the output the docs compare (not
    illustrations)."""
    printed, calls, namespace = run_python(example.code)
    for check in example.checks:
        assert eval(check, {**namespace, "printed": printed, "lines": printed.splitlines()}), (
            f"the docs promise `{check}`; the example printed\n{printed}"
        )
    if example.output is not None and not example.illustration:
        assert reads_as(example.output, printed), (
            f"the docs show\n{example.output}\nit printed\n{printed}"
        )
    for line, shown in example.exact_comments().items():
        lines = [text for at, text in calls if at == line]
        assert lines, f"line {line} of the example never printed (the docs show {shown!r})"
        for text in lines:
            assert same_line(shown, text.rstrip("\n")), (
                f"line {line}: the docs show {shown!r}, it printed {text!r}"
            )


@pytest.fixture(scope="module")
def docs_server(tmp_path_factory):
    server = start_sharing("demo", tmp_path_factory.mktemp("docs-home"), [])
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reproducible_server(tmp_path_factory):
    """The demo with --reproducible: float32 on kernels whose numbers do not depend on the CPU
    kind."""
    server = start_sharing(
        "demo", tmp_path_factory.mktemp("reproducible-docs-home"), ["--reproducible"]
    )
    try:
        yield server
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
def keyed_server(keyed_home, tmp_path_factory):
    env = {
        "MILLM_API_KEY_FILE": str(keyed_home / ".millm-api-key"),
        "MILLM_ADMIN_KEY_FILE": str(keyed_home / ".millm-admin-key"),
    }
    server = start_sharing("demo", tmp_path_factory.mktemp("keyed-docs-home"), [], env=env)
    try:
        yield server
    finally:
        server.stop()


EXAMPLES = list(examples())
# Generous: bf16 without AVX2 (ATen's portable loops) decodes several times slower, and a
# four-variant compare must still finish there; a hang still fails.
EXAMPLE_TIMEOUT = 600


def test_every_illustrated_example_states_its_promise():
    """Output shown only as an illustration checks nothing: such an example must carry checks."""
    bare = [param.id for param in EXAMPLES if param.values[0].unchecked()]
    assert not bare, (
        f"these examples show illustrations only; add <!-- check: ... --> lines: {bare}"
    )


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_runs_and_keeps_its_promises(request, monkeypatch, example):
    server = request.getfixturevalue(example.server)
    environment = None
    if "keyed" in example.flags:
        monkeypatch.setenv("HOME", str(request.getfixturevalue("keyed_home")))
        environment = dict(os.environ)
    example = replace(example, code=example.code.replace(BASE, server.base_url))
    if example.language == "python":
        check_output(example)
        return
    result = subprocess.run(
        ["bash", "-c", example.code],
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
        env=environment,
    )
    assert result.returncode == 0, result.stderr
    # an error body is {"error": {...}}; a view's `"error": null` (a job, a training) is not one
    assert (ERROR_BODY.search(result.stdout) is not None) == ("error" in example.flags), (
        result.stdout
    )
