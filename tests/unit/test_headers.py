"""RFC 8941 headers: round-trips through a parser, the byte cap with "+N more", percent-encoding,
strict values."""

import http_sfv
import pytest

from millm.errors import InvalidRequest
from millm.v1.http.headers import may_load, seed_header, strict_mode, string_list, token
from millm.v1.policy.field_policy import percent_encode


def parse_list(text: str) -> list[str]:
    parsed = http_sfv.List()
    parsed.parse(text.encode())
    return [entry.value for entry in parsed]


def test_string_list_round_trips():
    entries = ["foo", "messages[2].name", "extra_messages[0][1].weight", 'odd"quote\\slash']
    header = string_list(entries, 1024)
    assert parse_list(header) == entries


@pytest.mark.parametrize("count, cap", [(200, 1024), (50, 128), (10, 64)])
def test_cap_keeps_a_plus_n_more_entry(count, cap):
    entries = [f"field_number_{i}" for i in range(count)]
    header = string_list(entries, cap)
    assert len(header.encode()) <= cap
    parsed = parse_list(header)
    assert parsed[-1] == f"+{count - (len(parsed) - 1)} more"
    assert parsed[:-1] == entries[: len(parsed) - 1]


def test_no_entries_no_header():
    assert string_list([], 1024) is None


def test_percent_encoding_outside_printable_ascii():
    assert percent_encode("naïve") == "na%C3%AFve"
    assert percent_encode("tab\there") == "tab%09here"
    assert percent_encode("messages[0].ok_name") == "messages[0].ok_name"


def test_items():
    assert seed_header(7, "request") == '7;scope="request"'
    assert token("live", version=3) == "live;version=3"
    assert (
        token("profile", name='a "b"', scope="request")
        == 'profile;name="a \\"b\\"";scope="request"'
    )


@pytest.mark.parametrize(
    "value, strict",
    [(None, False), ("true", True), ("1", True), ("TRUE", True), ("false", False), ("0", False)],
)
def test_strict_values(value, strict):
    assert strict_mode(value) is strict


@pytest.mark.parametrize("value", ["yes", "", "2", "on"])
def test_other_strict_values_are_refused_naming_the_header(value):
    with pytest.raises(InvalidRequest) as info:
        strict_mode(value)
    assert info.value.param == "X-miLLM-Strict" and "X-miLLM-Strict" in info.value.message


def test_the_load_policy_is_auto_unless_refused():
    assert [may_load(v) for v in (None, "auto", " AUTO ", "refuse", " Refuse\t")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    with pytest.raises(InvalidRequest) as info:
        may_load("sometimes")
    assert (info.value.param, info.value.code) == ("X-miLLM-Load-Policy", "invalid_header")
