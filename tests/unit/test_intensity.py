"""The intensity rules of the API page, example by example."""

import pytest

from millm.errors import InvalidRequest
from millm.interp.intensity import (
    STRENGTH_LIMIT,
    Dial,
    applied_strength,
    circuit_lambda,
    clamp_strength,
    cluster_lambda,
    dial_lambda,
    echo,
    parse_dial,
)
from millm.interp.steering import STRENGTH_LIMIT as STEERING_LIMIT

CLUSTER_MIN, CIRCUIT_MIN, MAX = 0.5, 0.0, 2.0


@pytest.mark.parametrize(
    "raw, dial",
    [
        (0, Dial(value=0.0)),
        (1.5, Dial(value=1.5)),
        (2, Dial(value=2.0)),
        ("off", Dial(symbol="off")),
        ("min", Dial(symbol="min")),
        ("max", Dial(symbol="max")),
    ],
)
def test_parse(raw, dial):
    assert parse_dial(raw) == dial


@pytest.mark.parametrize("raw", [-0.1, 2.01, "MAX", "half", True, None, float("nan"), [1]])
def test_parse_refuses(raw):
    with pytest.raises(InvalidRequest) as info:
        parse_dial(raw)
    assert info.value.code == "invalid_parameter" and info.value.param == "steering_intensity"


@pytest.mark.parametrize(
    "dial, declared, expected",
    [
        ("off", (0.5, 1.5), 0.0),
        (0, (0.5, 1.5), 0.0),
        ("min", (0.5, 1.5), 0.5),  # symbols resolve to the declared range
        ("max", (0.5, 1.5), 1.5),
        ("max", (0.5, 3.0), 2.0),  # ... intersected with the [0, 2] envelope
        (1.8, (0.5, 1.5), 1.5),  # numeric λ capped at the range's maximum
        (0.1, (0.5, 1.5), 0.1),  # dialling below the declared floor is honoured
        ("min", None, CLUSTER_MIN),  # no declared range: CLUSTER_INTENSITY_MIN
        ("max", None, MAX),  # ... and the configured maximum
        (1.9, None, 1.9),
        (0.2, None, 0.2),
    ],
)
def test_cluster_rule(dial, declared, expected):
    assert cluster_lambda(parse_dial(dial), declared, CLUSTER_MIN, MAX) == pytest.approx(expected)


def test_cluster_rule_under_a_lower_configured_maximum():
    assert cluster_lambda(parse_dial(1.8), None, CLUSTER_MIN, 1.2) == pytest.approx(1.2)
    assert cluster_lambda(parse_dial("max"), (0.5, 1.5), CLUSTER_MIN, 1.2) == pytest.approx(1.2)


@pytest.mark.parametrize(
    "dial, declared, expected",
    [
        (0.1, (0.5, 1.5), 0.5),  # the page's example: clamped at the floor too
        (1.8, (0.5, 1.5), 1.5),
        (1.0, (0.5, 1.5), 1.0),
        (0, (0.5, 1.5), 0.0),  # only an exact 0 / off goes below the floor
        ("off", (0.5, 1.5), 0.0),
        ("min", (0.5, 1.5), 0.5),
        ("max", (0.5, 1.5), 1.5),
        ("min", None, 0.0),  # CIRCUIT_INTENSITY_MIN 0: without a range, min equals off
        ("max", None, MAX),
        (0.1, None, 0.1),
        ("max", (0.2, 5.0), 2.0),
    ],
)
def test_circuit_rule(dial, declared, expected):
    assert circuit_lambda(parse_dial(dial), declared, CIRCUIT_MIN, MAX) == pytest.approx(expected)


@pytest.mark.parametrize(
    "strength, sign, intensity, expected",
    [
        (10, 1, 1.5, 15.0),
        (10, -1, 1.5, -15.0),
        (150, 1, 2.0, 200.0),
        (-150, 1, 2.0, -200.0),
        (300, -1, 1.0, -200.0),
        (40, 1, 0.0, 0.0),
    ],
)
def test_applied_strength_is_clamped(strength, sign, intensity, expected):
    assert applied_strength(strength, sign, intensity) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.0, 0.0),
        (199.5, 199.5),
        (200.0, 200.0),
        (200.5, 200.0),
        (-200.5, -200.0),
        (1e9, 200.0),
        (-1e9, -200.0),
    ],
)
def test_clamp_strength(value, expected):
    assert clamp_strength(value) == expected
    assert STRENGTH_LIMIT == STEERING_LIMIT == 200.0  # one limit, whichever module it is read from


@pytest.mark.parametrize("dial", [0, 0.1, 0.4, 0.5, 1.0, 1.8, 2.0, "off", "min", "max"])
@pytest.mark.parametrize("declared", [None, (0.5, 1.5), (0.2, 5.0)])
def test_the_two_rules_differ_only_in_the_low_clamp(dial, declared):
    parsed = parse_dial(dial)
    assert cluster_lambda(parsed, declared, 0.5, MAX) == dial_lambda(
        parsed, declared, 0.5, MAX, clamp_low=False
    )
    assert circuit_lambda(parsed, declared, 0.5, MAX) == dial_lambda(
        parsed, declared, 0.5, MAX, clamp_low=True
    )
    # With the same floor, the rules agree wherever the number is not below the range.
    lo = declared[0] if declared else 0.5
    if parsed.symbol or parsed.value == 0 or parsed.value >= lo:
        assert cluster_lambda(parsed, declared, 0.5, MAX) == circuit_lambda(
            parsed, declared, 0.5, MAX
        )
    else:
        assert (
            cluster_lambda(parsed, declared, 0.5, MAX),
            circuit_lambda(parsed, declared, 0.5, MAX),
        ) == (parsed.value, lo)


@pytest.mark.parametrize(
    "value, text", [(1.5, "1.5"), (0.5, "0.5"), (2.0, "2.0"), (0.0, "0.0"), (1.23456, "1.235")]
)
def test_echo(value, text):
    assert echo(value) == text
