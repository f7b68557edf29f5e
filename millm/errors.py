"""Typed errors shared by every layer; the HTTP layer turns them into OpenAI-shaped bodies.

Each error carries the status and code the spec names for its situation, so the engine can
say *what* went wrong without knowing anything about HTTP frameworks.
"""

from __future__ import annotations


class MillmError(Exception):
    """Base of all errors the API reports to clients."""

    status: int = 500
    code: str = "internal_error"
    type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_dict(self) -> dict:
        """The OpenAI error object: {"message", "type", "param", "code"}."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


class InvalidRequest(MillmError):
    """400: the request itself is wrong; retrying it unchanged can never succeed."""

    status = 400
    code = "invalid_parameter"
    type = "invalid_request_error"


class FieldNotHonoured(InvalidRequest):
    """400: an output-changing field this endpoint or engine cannot honour."""

    code = "field_not_honoured"


class ContextLengthExceeded(InvalidRequest):
    """400: prompt plus completion budget does not fit the model's context window."""

    code = "context_length_exceeded"

    def __init__(self, *, limit: int, prompt_tokens: int, max_tokens: int | None, param: str = "messages"):
        if max_tokens == 0:  # embeddings: no completion, only the input
            message = (
                f"This model's maximum context length is {limit} tokens. However, the input is "
                f"{prompt_tokens} tokens. Please shorten it."
            )
        elif max_tokens is None:
            message = (
                f"This model's maximum context length is {limit} tokens. However, your prompt is "
                f"{prompt_tokens} tokens, which leaves no room for a completion. Please shorten the prompt."
            )
        else:
            message = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} in the "
                f"completion). Please reduce the prompt or max_tokens."
            )
        super().__init__(message, param=param)
        self.limit = limit
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens


class NotFound(MillmError):
    """404: a management resource (SAE, profile, ...) that does not exist; the code names which."""

    status = 404
    code = "not_found"
    type = "invalid_request_error"


class Conflict(MillmError):
    """409: the request clashes with what is stored (a name taken, an SAE still attached)."""

    status = 409
    code = "conflict"
    type = "invalid_request_error"


class ModelNotFound(MillmError):
    """404: the request names a model this server does not know."""

    status = 404
    code = "model_not_found"
    type = "invalid_request_error"


class ModelNotLoaded(MillmError):
    """503: no model is loaded (yet) to serve the request."""

    status = 503
    code = "model_not_loaded"
    type = "server_error"


class QueueFull(MillmError):
    """503: admission is bounded and the queue is at its limit."""

    status = 503
    code = "queue_full"
    type = "server_error"


class InsufficientMemory(MillmError):
    """503: a device ran out of memory (the spec types the generation case invalid_request_error)."""

    status = 503
    code = "insufficient_memory"
    type = "invalid_request_error"


class InsufficientMemoryToLoad(InsufficientMemory):
    """503: the named model has to be loaded and the device cannot hold it; carries the figures.

    Typed like the generation case (the request names something that does not fit, and retrying
    it unchanged only helps if memory is freed), and refused before the loaded model is unloaded.
    """

    def __init__(self, message: str, devices: list[dict], *, param: str | None = "model"):
        super().__init__(message, param=param)
        self.devices = devices

    def to_dict(self) -> dict:
        """OpenAI's four fields plus `devices`: needed and free bytes for each device."""
        return {**super().to_dict(), "devices": self.devices}


class UnsupportedQuantization(MillmError):
    """400: the named model's weights are quantized in a way this server cannot run."""

    status = 400
    code = "unsupported_quantization"
    type = "invalid_request_error"


class ModelLoadFailed(MillmError):
    """500: loading the named model failed; the message is the failure's."""

    status = 500
    code = "model_load_failed"
    type = "server_error"


class ModelBusy(MillmError):
    """503: a model is being unloaded or another load is in progress; retry once it finishes."""

    status = 503
    code = "model_busy"
    type = "server_error"


class ModelLocked(MillmError):
    """409: the server is locked to another model for steering; an operator must unlock it first.

    Not a 503: retrying never helps until someone unlocks. Not a 404: the model exists.
    """

    status = 409
    code = "model_locked"
    type = "invalid_request_error"


class ServerShuttingDown(MillmError):
    """503: the server stopped before the request could run."""

    status = 503
    code = "server_shutting_down"
    type = "server_error"


class ModelSourceError(Exception):
    """A model source (path, .gguf file, hub id) that cannot be resolved or loaded."""


class GenerationFailed(MillmError):
    """500: the engine failed while generating; the message says how."""

    status = 500
    code = "generation_failed"
    type = "server_error"


def describe(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, short enough for an error body or a log line."""
    lines = str(exc).strip().splitlines()
    first = lines[0][:limit] if lines else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
