"""response_format's answer: a finished document is validated with the jsonschema package, so
finish_reason "stop" means "complete and valid", and a complete document that fails validation
is a 500 constrained_output_invalid, never a 200. What a request may ask for is checked while
its body is parsed (protocol/response_format.py).
"""

from __future__ import annotations

import json

from millm.errors import ConstrainedOutputInvalid
from millm.protocol.response_format import Structured


def validate_output(structured: Structured, text: str, index: int) -> None:
    """A complete document must parse and validate; otherwise 500 constrained_output_invalid."""
    from jsonschema import Draft202012Validator

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConstrainedOutputInvalid(
            f"choice {index}: the completed output is not valid JSON ({exc})"
        ) from None
    if structured.mode == "json_object":
        if not isinstance(document, dict):
            raise ConstrainedOutputInvalid(
                f"choice {index}: the completed output is not a JSON object"
            )
        return
    error = next(iter(Draft202012Validator(structured.schema).iter_errors(document)), None)
    if error is not None:
        where = "/" + "/".join(str(p) for p in error.absolute_path)
        raise ConstrainedOutputInvalid(
            f"choice {index}: the completed output fails the schema at {where}: {error.message}"
        )
