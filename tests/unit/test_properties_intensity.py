"""Properties of the intensity rules (millm/interp/intensity.py) over random dials, declared
ranges and settings: what parse_dial accepts is exactly what its served schema (DIAL_SCHEMA)
allows; λ under the cluster rule is capped above only and under the circuit rule clamped at
both ends, both monotone in the dial and inside [0, maximum]; an applied strength is the
product clamped to ±200, monotone in λ and odd in the sign; the echoed λ is the RFC 8941
decimal of λ to three places.
"""

from __future__ import annotations

from decimal import Decimal

import http_sfv
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from millm.errors import InvalidRequest
from millm.interp.intensity import (
    DIAL_SCHEMA,
    ENVELOPE_MAX,
    Dial,
    applied_strength,
    circuit_lambda,
    cluster_lambda,
    echo,
    parse_dial,
)

DIALS = st.floats(0, ENVELOPE_MAX)
# CLUSTER/CIRCUIT_INTENSITY_MIN and STEERING_INTENSITY_MAX: 0–2
SETTINGS = st.floats(0, ENVELOPE_MAX)
# A document declares [lo, hi] with 0 <= lo <= hi (mistudio.py); hi may pass the envelope.
DECLARED = st.none() | st.tuples(st.floats(0, 5), st.floats(0, 5)).map(sorted).map(tuple)
STRENGTHS = st.floats(-1e6, 1e6)
SIGNS = st.sampled_from([1, -1])
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-3, 3)
    | st.sampled_from(["off", "min", "max", "MAX", "", "1"]),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner, max_size=2)
    ),
    max_leaves=3,
)
RULES = {"cluster": cluster_lambda, "circuit": circuit_lambda}


def bounds(declared, floor, maximum):
    """[lo, hi] as the module docstring states it, written out again independently."""
    if declared is None:
        return min(floor, maximum), maximum
    lo, hi = (min(max(end, 0.0), maximum) for end in declared)
    return lo, max(lo, hi)


@given(JSON)
def test_parse_dial_accepts_exactly_what_the_served_schema_allows(raw):
    allowed = Draft202012Validator(DIAL_SCHEMA).is_valid(raw)
    try:
        dial = parse_dial(raw)
    except InvalidRequest as refusal:
        assert not allowed, f"{raw!r} is valid for DIAL_SCHEMA but refused"
        assert refusal.code == "invalid_parameter" and refusal.param == "steering_intensity"
    else:
        assert allowed, f"{raw!r} is accepted but DIAL_SCHEMA refuses it"
        assert dial == (Dial(symbol=raw) if isinstance(raw, str) else Dial(value=float(raw)))
        assert dial.off == (raw == "off" or raw == 0)


@pytest.mark.parametrize("raw", [float("nan"), float("inf"), float("-inf")])
def test_parse_dial_refuses_non_finite_numbers(raw):
    with pytest.raises(InvalidRequest):
        parse_dial(raw)


@given(st.sampled_from(sorted(RULES)), DIALS, DIALS, DECLARED, SETTINGS, SETTINGS)
def test_lambda_is_within_zero_and_the_maximum_and_monotone_in_the_dial(
    rule, a, b, declared, floor, maximum
):
    low, high = sorted((a, b))
    resolve = RULES[rule]
    first, second = (resolve(Dial(value=v), declared, floor, maximum) for v in (low, high))
    assert 0.0 <= first <= second <= maximum


@given(DIALS, DECLARED, SETTINGS, SETTINGS)
def test_cluster_rule_caps_above_only_and_symbols_go_to_the_range_ends(
    value, declared, floor, maximum
):
    lo, hi = bounds(declared, floor, maximum)
    # below the floor is honoured
    assert cluster_lambda(Dial(value=value), declared, floor, maximum) == min(value, hi)
    assert cluster_lambda(Dial(symbol="min"), declared, floor, maximum) == lo
    assert cluster_lambda(Dial(symbol="max"), declared, floor, maximum) == hi
    assert cluster_lambda(Dial(symbol="off"), declared, floor, maximum) == 0.0


@given(DIALS, DECLARED, SETTINGS, SETTINGS)
def test_circuit_rule_clamps_at_both_ends_and_only_zero_goes_below_the_floor(
    value, declared, floor, maximum
):
    lo, hi = bounds(declared, floor, maximum)
    resolved = circuit_lambda(Dial(value=value), declared, floor, maximum)
    assert resolved == (0.0 if value == 0 else min(max(value, lo), hi))
    assert circuit_lambda(Dial(symbol="min"), declared, floor, maximum) == lo
    assert circuit_lambda(Dial(symbol="max"), declared, floor, maximum) == hi
    assert circuit_lambda(Dial(symbol="off"), declared, floor, maximum) == 0.0


@given(STRENGTHS, SIGNS, DIALS, DIALS)
def test_applied_strength_is_the_clamped_product_monotone_in_lambda_and_odd_in_the_sign(
    strength, sign, a, b
):
    low, high = sorted((a, b))
    applied = applied_strength(strength, sign, low)
    assert -200.0 <= applied <= 200.0
    product = sign * strength * low
    assert applied == (product if abs(product) <= 200 else 200.0 * (1 if product > 0 else -1))
    later = applied_strength(strength, sign, high)
    assert (applied <= later) if sign * strength >= 0 else (applied >= later)
    assert applied_strength(strength, -sign, low) == -applied


@given(DIALS)
def test_echo_is_the_rfc_8941_decimal_of_lambda_to_three_places(value):
    parsed = http_sfv.Item()
    parsed.parse(echo(value).encode())
    assert isinstance(parsed.value, Decimal)
    assert parsed.value == Decimal(f"{round(value, 3):.3f}")
