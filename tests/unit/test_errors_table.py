"""The error table in millm/errors.py against the spec's and the docs' error tables, and its
invariants."""

import re
from pathlib import Path

import pytest

from millm.errors import (
    InsufficientMemoryToLoad,
    InvalidRequest,
    MillmError,
    NotFound,
    QueueFull,
    table,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openai-api.md"
SPEC = Path("/work/shared/spec/openai-api.md")  # the project's spec, where this checkout has it

# Codes the table has no row for: a raise site narrows the code of the class that carries the
# status and type (e.g. NotFound(..., code="profile_not_found")).
NARROWED = {
    "profile_not_found": NotFound,
    "profile_not_applicable": InvalidRequest,
    "no_chat_template": InvalidRequest,
    "operator_not_applicable": InvalidRequest,
    "probe_not_found": InvalidRequest,
    "vector_not_found": InvalidRequest,
    "response_not_found": NotFound,
}
ROWS = {code: (status, type_) for code, status, type_, _ in table()}
# The one code the spec spells in capitals ("returns 400 AMBIGUOUS_MODEL_NAME"): kept verbatim so a
# client comparing against the spec's text matches; every other code is lower snake case.
SPEC_CAPITALISED = {"AMBIGUOUS_MODEL_NAME"}


def spec_rows(text: str) -> list[tuple[str, str, str]]:
    """(situation, status, code) of the tab-separated table under
    "Situation<TAB>Status<TAB>code"."""
    lines = text.splitlines()
    start = lines.index("Situation\tStatus\tcode") + 1
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        situation, status, code = line.split("\t")
        rows.append((situation, status, code))
    return rows


def docs_rows(text: str) -> list[tuple[str, str, str]]:
    """(situation, status, code) of the markdown table headed | Situation | Status | `code` |."""
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].isdigit():
            for code in re.findall(r"`([a-z_]+|[A-Z_]+)`", cells[2]):
                rows.append((cells[0], cells[1], code))
    return rows


def check_row(situation: str, status: str, code: str) -> None:
    cls = NARROWED.get(code)
    if cls is not None:
        assert code in source_codes(), f"{code} is narrowed at no raise site"
        expected_status, expected_type = cls.status, cls.type
    else:
        assert code in ROWS, f"{code} ({situation[:60]}) has no row in millm/errors.py"
        expected_status, expected_type = ROWS[code]
    if status.isdigit():  # the in-stream rows say "SSE error event" instead of a status
        assert int(status) == expected_status, code
    stated = re.search(r"\b[Tt]ype (invalid_request_error|server_error)\b", situation)
    if stated:
        assert stated.group(1) == expected_type, code


def source_codes() -> set[str]:
    """Every code="..." a raise site under millm/ passes."""
    root = Path(__file__).resolve().parents[2] / "millm"
    return {
        m
        for path in root.rglob("*.py")
        for m in re.findall(r'code="([a-zA-Z_]+)"', path.read_text())
    }


def test_every_row_of_the_docs_table_is_a_row_of_the_error_table():
    rows = docs_rows(DOCS.read_text())
    assert len(rows) >= 20  # the table was found and read
    for row in rows:
        check_row(*row)


def test_every_row_of_the_spec_table_is_a_row_of_the_error_table():
    if not SPEC.is_file():
        pytest.skip(f"the spec is not at {SPEC} in this checkout")
    rows = spec_rows(SPEC.read_text())
    assert len(rows) >= 18
    for row in rows:
        check_row(*row)


def test_codes_are_unique_and_statuses_and_types_valid():
    codes = [code for code, _, _, _ in table()]
    assert len(codes) == len(set(codes))
    for code, status, type_, cls in table():
        assert re.fullmatch(r"[a-z]+(_[a-z0-9]+)*", code) or code in SPEC_CAPITALISED, code
        assert 400 <= status <= 599, cls
        assert type_ in ("invalid_request_error", "server_error"), cls
        # 5xx are the server's fault except running out of memory, which the spec types as the
        # request's.
        assert (type_ == "server_error") == (status >= 500 and code != "insufficient_memory"), cls
        assert cls.__module__ == "millm.errors", f"{cls} declares a row outside the one table"


def test_capitalised_codes_are_the_spec_s_own_spelling():
    assert set(ROWS) >= SPEC_CAPITALISED
    if SPEC.is_file():
        for code in SPEC_CAPITALISED:
            assert f"400 {code}" in SPEC.read_text(), code


def test_subclasses_of_invalid_request_are_400():
    for _, status, type_, cls in table():
        if issubclass(cls, InvalidRequest):
            assert (status, type_) == (400, "invalid_request_error"), cls


def test_a_row_is_all_three_or_nothing():
    with pytest.raises(TypeError, match="status, code and type together"):

        class Partial(MillmError, code="partial"):
            pass


def test_rows_are_real_classes_raised_and_caught_with_their_body():
    with pytest.raises(MillmError) as info:
        raise QueueFull("the queue is full", param="x")
    assert isinstance(info.value, QueueFull)
    assert (info.value.status, info.value.to_dict()) == (
        503,
        {
            "message": "the queue is full",
            "type": "server_error",
            "param": "x",
            "code": "queue_full",
        },
    )
    narrowed = NotFound("no such profile", code="profile_not_found")
    assert (narrowed.status, narrowed.code, NotFound.code) == (
        404,
        "profile_not_found",
        "not_found",
    )
    tight = InsufficientMemoryToLoad("too big", [{"device": "cpu", "needed": 2, "free": 1}])
    assert (
        tight.to_dict()["devices"] == [{"device": "cpu", "needed": 2, "free": 1}]
        and tight.status == 503
    )
