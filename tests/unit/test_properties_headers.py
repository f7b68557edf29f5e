"""Properties of the RFC 8941 header encoding (millm/v1/http/headers.py), checked by parsing the
output back with http_sfv: items and tokens carry their values and parameters unchanged (text
outside printable ASCII percent-encoded), and a capped string list never exceeds its cap,
keeps the longest prefix that fits and counts the rest exactly in its "+N more" entry.
"""

from __future__ import annotations

from decimal import Decimal
from urllib.parse import unquote

import http_sfv
from hypothesis import given
from hypothesis import strategies as st

from millm.v1.http.headers import item, string_list, token
from millm.v1.policy.field_policy import PRINTABLE_ASCII, percent_encode

KEYS = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
INTEGERS = st.integers(-999_999_999_999_999, 999_999_999_999_999)  # RFC 8941's integer range
# Decimals have at most 12 integer and 3 fraction digits; floats with 3 places are what callers
# send.
THOUSANDTHS = st.integers(-999_999_999_999_999, 999_999_999_999_999)
ASCII = st.text(PRINTABLE_ASCII, max_size=12)
TOKENS = st.from_regex(r"[A-Za-z*][A-Za-z0-9!#$%&'*+.^_`|~:/-]{0,8}", fullmatch=True)
# Names from documents may hold anything, "%" included (encoded too, so decoding is unambiguous).
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def values(draw):
    """(what is passed to item(), what parsing the header must give back)."""
    kind = draw(st.sampled_from(["integer", "decimal", "ascii", "text", "boolean", "token"]))
    if kind == "integer":
        number = draw(INTEGERS)
        return number, number
    if kind == "decimal":
        thousandths = draw(THOUSANDTHS)
        return thousandths / 1000, Decimal(thousandths) / 1000
    if kind == "ascii":
        text = draw(ASCII)
        return text, text.replace("%", "%25")
    if kind == "text":
        text = draw(ANY_TEXT)
        return text, percent_encode(text)
    if kind == "boolean":
        flag = draw(st.booleans())
        return flag, flag
    name = draw(TOKENS)
    return http_sfv.Token(name), http_sfv.Token(name)


def parse_item(text: str) -> http_sfv.Item:
    parsed = http_sfv.Item()
    parsed.parse(text.encode())
    return parsed


def parse_list(text: str) -> list[str]:
    parsed = http_sfv.List()
    parsed.parse(text.encode())
    return [entry.value for entry in parsed]


@given(values(), st.dictionaries(KEYS, values(), max_size=4))
def test_an_item_parses_back_to_its_value_and_parameters(value, params):
    header = item(value[0], **{key: sent for key, (sent, _) in params.items()})
    parsed = parse_item(header)
    assert parsed.value == value[1] and type(parsed.value) is type(value[1])
    assert dict(parsed.params) == {key: back for key, (_, back) in params.items()}


@given(TOKENS, st.dictionaries(KEYS, values(), max_size=4))
def test_a_token_parses_back_as_that_token(name, params):
    parsed = parse_item(token(name, **{key: sent for key, (sent, _) in params.items()}))
    assert isinstance(parsed.value, http_sfv.Token) and parsed.value == name
    assert dict(parsed.params) == {key: back for key, (_, back) in params.items()}


@given(ANY_TEXT)
def test_text_outside_printable_ascii_decodes_back_to_itself(text):
    assert unquote(parse_item(token("cluster", name=text)).params["name"]) == text


def more(count: int) -> list[str]:
    return [f"+{count} more"] if count else []


# The count is drawn first so that long lists, which the cap cuts, are common.
@given(
    st.integers(0, 60).flatmap(lambda n: st.lists(ASCII, min_size=n, max_size=n)),
    st.integers(64, 400),
)  # 64: the setting's least
def test_a_string_list_fits_its_cap_keeps_the_longest_prefix_and_counts_the_rest(entries, cap):
    header = string_list(entries, cap)
    if not entries:
        assert header is None
        return
    assert len(header.encode()) <= cap
    parsed = parse_list(header)
    if parsed == entries:
        return
    *kept, last = parsed
    assert kept == entries[: len(kept)]
    assert last == f"+{len(entries) - len(kept)} more"
    # One more entry (with the count of the rest after it, if any) would not have fitted.
    longer = entries[: len(kept) + 1] + more(len(entries) - len(kept) - 1)
    values = http_sfv.List()
    values.extend(http_sfv.Item(entry) for entry in longer)
    assert len(str(values).encode()) > cap
