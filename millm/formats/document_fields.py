"""What every imported document shares: validation that names each problem with its JSON location
(`steering[0].features[3].strength: ...`) in the words the documents' pages use, and the field
types and base model (strict JSON) the profile, probe and miStudio models are built from."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import ErrorDetails, PydanticCustomError

from millm.errors import InvalidRequest

# The steering range: authored strengths outside it are refused, derived ones (strength · λ,
# sums of members) are clamped into it by interp.intensity's clamp_strength.
STRENGTH_LIMIT = 200.0

Model = TypeVar("Model", bound=BaseModel)

# pydantic's words for structure, said as the documents' pages say them.
PHRASES = {
    "missing": "required",
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "extra_forbidden": "unknown key",
}
SHOWN_VALUE = (
    40  # characters of a refused scalar value quoted back (a 10,000-character narrative is not)
)


# ---- errors with their JSON location ------------------------------------------------------------
def _where(error: ErrorDetails, doc: Any, prefix: str) -> str:
    """pydantic's location as a JSON path ('steering[0].features[3].strength'), union tags left
    out."""
    path, node, loc = prefix, doc, error["loc"]
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
            node = node[part] if isinstance(node, list) and part < len(node) else None
        elif isinstance(node, dict) and (
            part in node or (error["type"] == "missing" and i == len(loc) - 1)
        ):
            path += f".{part}" if path else part
            node = node.get(part)
        # else: the tag of the union member pydantic tried, not a key of the document
    return path or "document"


def _what(error: ErrorDetails) -> str:
    """What is wrong, with the refused value when it is a short scalar."""
    phrase = PHRASES.get(error["type"], error["msg"])
    value = error.get("input")
    if error["type"] not in ("missing", "extra_forbidden") and (
        value is None or isinstance(value, (str, int, float))
    ):
        shown = json.dumps(value)
        if len(shown) <= SHOWN_VALUE:
            phrase += f", got {shown}"
    return phrase


def problems(error: ValidationError, doc: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(JSON location, what is wrong) for each problem pydantic found in `doc`."""
    return [(_where(e, doc, prefix), _what(e)) for e in error.errors()]


def validate_document(
    model: type[Model], doc: Any, error: type[InvalidRequest], what: str
) -> Model:
    """`doc` as `model`, or `error` listing every problem with its location ("invalid <what>:
    ...")."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        listed = "; ".join(f"{where}: {problem}" for where, problem in problems(exc, doc))
        raise error(f"invalid {what}: {listed}") from None


def field_error(exc: ValidationError, value: Any, param: str) -> InvalidRequest:
    """A request field's first problem as a 400 naming its location under `param` (and how many
    more there are)."""
    (where, problem), *more = problems(exc, value, param)
    if more:
        problem += f" (and {len(more)} more problem{'s' if len(more) > 1 else ''})"
    return InvalidRequest(f"{where}: {problem}", param=where)


def validate_field(model: type[Model], value: Any, param: str = "") -> Model:
    """A request's object as `model`, or a 400 naming the first problem's location (as request
    bodies are refused)."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise field_error(exc, value, param) from None


def refused_by(refuse: Callable[[ValidationError, Any], Exception]) -> WrapValidator:
    """Annotated after a request field's type: a problem in it is refused at once by `refuse`, in
    the words of the field's own format (its locations, its error code), not as a body's."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError as exc:
            raise refuse(exc, value) from None

    return WrapValidator(check)


def refused_under(param: str) -> WrapValidator:
    """`refused_by` as a 400 naming the first problem's location under `param` (validate_field's
    words)."""
    return refused_by(lambda exc, value: field_error(exc, value, param))


# ---- field types --------------------------------------------------------------------------------
def refusal(code: str, message: str, **ctx) -> PydanticCustomError:
    """A validator's refusal in pydantic's terms (a plain ValueError would read 'Value error,
    ...')."""
    return PydanticCustomError(code, message, ctx)


def said(phrase: str) -> WrapValidator:
    """Annotated after a type: refused in one phrase (a pattern or several bounds say less than
    the rule's words)."""

    def check(value, handler):
        try:
            return handler(value)
        except ValidationError:
            raise refusal("document_rule", phrase) from None

    return WrapValidator(check)


def no_bools(choices: str) -> WrapValidator:
    """Annotated after a Literal of integers: true and false refused (pydantic lets true pass for
    1)."""

    def check(value, handler):
        if isinstance(value, bool):
            raise refusal("literal_error", f"Input should be {choices}")
        return handler(value)

    return WrapValidator(check)


def unique(key, what: str):
    """An after-validator refusing a list in which `key` of two items is the same."""

    def check(items: list) -> list:
        keys = [key(item) for item in items]
        twice = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if twice:
            raise refusal("duplicate", what, twice=", ".join(map(str, twice)))
        return items

    return AfterValidator(check)


def _ordered(pair: list[float]) -> list[float]:
    if pair[0] > pair[1]:
        raise refusal("range_order", "[lo, hi] with lo <= hi")
    return pair


NonNegative = Annotated[int, Field(ge=0)]
# first mention kept
Indices = Annotated[list[NonNegative], AfterValidator(lambda indices: list(dict.fromkeys(indices)))]


class Document(BaseModel):
    """Strict JSON: no "5" for 5, no true for 1, no NaN. Unknown keys pass (callers keep the raw
    miStudio document, and a profile's canonical form is dumped from the model, without them)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
