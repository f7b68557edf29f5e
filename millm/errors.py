"""Typed errors shared by every layer; the HTTP layer turns them into OpenAI-shaped bodies.

Every error the API reports is one line of the table below, `class Name(Base, status=, code=,
type=)`, so the table can be read beside the spec's error table ("Errors & backpressure") line
by line; tests/unit/test_errors_table.py compares the two. The engine says *what* went wrong
without knowing anything about HTTP frameworks. A raise site may narrow `code` (NotFound with
code="profile_not_found"); the status and type always come from the class.
"""

from __future__ import annotations

# Every class that declares a row, in the order they were defined (see `table`).
_ROWS: list[type[MillmError]] = []


class MillmError(Exception):
    """Base of all errors the API reports to clients."""

    status: int = 500
    code: str = "internal_error"
    type: str = "server_error"
    # Seconds a client should wait before trying again: every 503 says it (Retry-After).
    retry_after: int | None = None

    def __init_subclass__(
        cls,
        *,
        status: int | None = None,
        code: str | None = None,
        type: str | None = None,
        retry_after: int | None = None,
        **kwargs,
    ):
        super().__init_subclass__(**kwargs)
        if retry_after is not None:
            cls.retry_after = retry_after
        if status is None and code is None and type is None:
            return  # a subclass that changes behaviour only (a message, extra fields), not the row
        if status is None or code is None or type is None:
            # A row is read on its own line: a partial one would hide an inherited part.
            raise TypeError(f"{cls.__name__}: an error row names status, code and type together")
        cls.status, cls.code, cls.type = status, code, type
        _ROWS.append(cls)

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if retry_after is not None:  # a raise site that knows better than its class (a wait)
            self.retry_after = retry_after

    def to_dict(self) -> dict:
        """The OpenAI error object: {"message", "type", "param", "code"}."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}


def table() -> list[tuple[str, int, str, type[MillmError]]]:
    """Every declared row as (code, status, type, class), in definition order."""
    return [(cls.code, cls.status, cls.type, cls) for cls in _ROWS]


# The table. Request errors (400-413) first, then the server's state (404/409/500/503); a 503
# names the seconds its Retry-After says (a raise site may say fewer or more: a queue's wait).
# One row a class, read down the columns: the formatter leaves it as written.
# fmt: off
# ---- the request itself is wrong; retrying it unchanged can never succeed
class InvalidRequest(MillmError, status=400, code="invalid_parameter", type="invalid_request_error"): """A field out of range, of the wrong type, or a rule across fields."""
class FieldNotHonoured(InvalidRequest, status=400, code="field_not_honoured", type="invalid_request_error"): """An output-changing field this endpoint or engine cannot honour."""
class UnusedFieldsRefused(InvalidRequest, status=400, code="unused_fields_refused", type="invalid_request_error"): """Strict mode: the request carries fields this path would ignore."""
class InvalidScoringRequest(InvalidRequest, status=400, code="invalid_scoring_request", type="invalid_request_error"): """A scoring request that can never be answered (token outside the vocabulary, empty prompt)."""
class ContextLengthExceeded(InvalidRequest, status=400, code="context_length_exceeded", type="invalid_request_error"):
    """Prompt plus completion budget does not fit the model's context window."""

    def __init__(self, *, limit: int, prompt_tokens: int, max_tokens: int | None, param: str = "messages"):
        if max_tokens == 0:  # embeddings: no completion, only the input
            message = (
                f"This model's maximum context length is {limit} tokens. However, the input is "
                f"{prompt_tokens} tokens. Please shorten it."
            )
        elif max_tokens is None:
            message = (
                f"This model's maximum context length is {limit} tokens. However, your prompt is "
                f"{prompt_tokens} tokens, which leaves no room for a completion. Please shorten "
                "the prompt."
            )
        else:
            message = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                f"{max_tokens} in the completion). Please reduce the prompt or max_tokens."
            )
        super().__init__(message, param=param)
        self.limit = limit
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens


class InputsTooLong(ContextLengthExceeded):
    """Embeddings inputs over the context window, every one named (they are never truncated)."""

    SHOWN = 16  # over-long inputs the message lists by name

    def __init__(self, *, limit: int, over: list[tuple[str, int]]):
        named = [f"{where} is {tokens} tokens" for where, tokens in over[: self.SHOWN]]
        more = f" (and {len(over) - self.SHOWN} more)" if len(over) > self.SHOWN else ""
        listed = ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1]
        message = (
            f"{listed}{more}: over this model's maximum context length of {limit} tokens; "
            "inputs are never truncated, so shorten or split them"
        )
        InvalidRequest.__init__(self, message, param=over[0][0])
        self.limit, self.prompt_tokens, self.max_tokens = limit, over[0][1], 0
        self.over = over


class ResponseFormatUnsupported(InvalidRequest, status=400, code="response_format_unsupported", type="invalid_request_error"):
    """A response_format that cannot be honoured (keyword, engine, combination)."""

    def __init__(self, message: str, param: str = "response_format"):
        super().__init__(message, param=param)


class InvalidFeatureIndex(InvalidRequest, status=400, code="invalid_feature_index", type="invalid_request_error"): """A feature index past the SAE's width; a steering base that no longer fits."""
class InvalidProfile(InvalidRequest, status=400, code="invalid_profile", type="invalid_request_error"): """A profile document that does not follow the format; the message lists every problem."""
class InvalidProbe(InvalidRequest, status=400, code="invalid_probe", type="invalid_request_error"): """A probe document that does not follow the format; the message lists every problem."""
class InvalidDocument(InvalidRequest, status=400, code="invalid_document", type="invalid_request_error"): """A miStudio document that does not follow its format; the message lists every problem."""
class SAEFormatError(InvalidRequest, status=400, code="invalid_sae", type="invalid_request_error"): """An SAE file millm cannot use, with the reason."""
class UnsupportedQuantization(MillmError, status=400, code="unsupported_quantization", type="invalid_request_error"): """The named model's weights are quantized in a way this server cannot run."""
# ---- who may ask: keys, sites, paths, sizes
class InvalidAPIKey(MillmError, status=401, code="invalid_api_key", type="invalid_request_error"): """The route needs a key and the request sent none, a wrong one, or one that does not open it."""
class CrossSiteRequest(MillmError, status=403, code="cross_site_request", type="invalid_request_error"): """A browser request from another site's page to a route that changes state."""
class PathNotAllowed(MillmError, status=403, code="path_not_allowed", type="invalid_request_error"): """A path outside the directories this server may read for clients."""
class RequestTooLarge(MillmError, status=413, code="request_too_large", type="invalid_request_error"): """A request body over MAX_REQUEST_BYTES."""
class DocumentTooLarge(RequestTooLarge, status=413, code="document_too_large", type="invalid_request_error"): """An import body over MAX_IMPORT_BYTES."""
class ClientGone(MillmError, status=499, code="client_closed_request", type="invalid_request_error"): """The client disconnected before its answer was ready (nginx's 499); nobody reads it."""
# ---- what the server holds
class NotFound(MillmError, status=404, code="not_found", type="invalid_request_error"): """A management resource (SAE, profile, ...) that does not exist; the raise site's code names which."""
class AmbiguousModelName(MillmError, status=400, code="AMBIGUOUS_MODEL_NAME", type="invalid_request_error"): """A bare repository name while several of its quantisations (repo:QUANT) are registered."""
class ModelNotFound(MillmError, status=404, code="model_not_found", type="invalid_request_error"): """The request names a model this server does not know."""
class Conflict(MillmError, status=409, code="conflict", type="invalid_request_error"): """The request clashes with what is stored (a name taken, an SAE still attached)."""
class VersionConflict(Conflict, status=409, code="revision_conflict", type="invalid_request_error"): """The write named the version it read, and another writer changed the row since."""
# Not a 503: retrying never helps until someone unlocks. Not a 404: the model exists.
# The Batch API's files (/v1/files).
class InvalidBatchRequest(InvalidRequest, status=400, code="invalid_batch_request", type="invalid_request_error"): """A files or batches request millm cannot take (a purpose, a missing part)."""
class BatchFileLimit(InvalidRequest, status=400, code="batch_file_limit", type="invalid_request_error"): """A file over MILLM_BATCH_MAX_FILE_BYTES or MILLM_BATCH_MAX_ROWS; nothing was stored."""
class FileNotFound(MillmError, status=404, code="file_not_found", type="invalid_request_error"): """No file has this id."""
class FileExpired(MillmError, status=404, code="file_expired", type="invalid_request_error"): """The file's retention ended: its bytes are gone, its record is kept."""
class FileDeleted(MillmError, status=404, code="file_deleted", type="invalid_request_error"): """The file was deleted: its bytes are gone, its record is kept."""
class FileInUse(MillmError, status=409, code="file_in_use", type="invalid_request_error"): """A batch that has not ended reads this file; the message names it."""
class BatchNotFound(MillmError, status=404, code="batch_not_found", type="invalid_request_error"): """No batch has this id."""
class BatchStateConflict(MillmError, status=409, code="batch_state_conflict", type="invalid_request_error"): """The batch's status cannot make this move (a cancel of one that ended)."""
class LeaseNotFound(MillmError, status=404, code="lease_not_found", type="invalid_request_error"): """No live lease on this model has the id sent (a restart ends every lease)."""
class LeaseExpired(MillmError, status=409, code="lease_expired", type="invalid_request_error"): """The lease the id names has ended (released, expired, or its model unloaded)."""
# A client's lease keeps the loaded model: what would swap it away waits for the lease's end.
class ModelLeased(MillmError, status=409, code="model_leased", type="invalid_request_error"): """The loaded model is leased by another client; the message says who, why and until when."""
# The request's X-miLLM-Load-Policy: refuse forbade the load that would have served it.
class ModelNotResident(MillmError, status=409, code="model_not_resident", type="invalid_request_error"): """The named model is not the loaded one, and the request forbade loading it."""
class ModelLocked(MillmError, status=409, code="model_locked", type="invalid_request_error"): """The server is locked to another model for steering; an operator must unlock it first."""
# ---- the server failed; the message says how
class ModelLoadFailed(MillmError, status=500, code="model_load_failed", type="server_error"): """Loading the named model failed; the message is the failure's."""
class GenerationFailed(MillmError, status=500, code="generation_failed", type="server_error"): """The engine failed while generating; the message says how."""
class NonFiniteLogits(MillmError, status=500, code="non_finite_logits", type="server_error"): """NaN or +inf logits reached the answer, or a reported token's logit is -inf."""
class EmbeddingInvalid(MillmError, status=500, code="embedding_vector_invalid", type="server_error"): """An embedding came out non-finite, or with no length to normalise; the message names its input."""
class ConstrainedOutputInvalid(MillmError, status=500, code="constrained_output_invalid", type="server_error"): """The model closed a document that does not validate (the grammar and the validator disagree)."""
# ---- not now: retry later
class ModelNotLoaded(MillmError, status=503, code="model_not_loaded", type="server_error", retry_after=30): """No model is loaded (yet) to serve the request."""
class QueueFull(MillmError, status=503, code="queue_full", type="server_error", retry_after=5): """Admission is bounded and the queue (or the pool of passing threads) is at its limit."""
class ModelBusy(MillmError, status=503, code="model_busy", type="server_error", retry_after=15): """A model is being unloaded or another load is in progress; retry once it finishes."""
class ServerShuttingDown(MillmError, status=503, code="server_shutting_down", type="server_error", retry_after=10): """The server stopped before the request could run."""
class StoreUnavailable(MillmError, status=503, code="store_unavailable", type="server_error", retry_after=5): """The database cannot be reached now; nothing was changed."""
# The spec types this invalid_request_error: the request names something that does not fit.
class InsufficientMemory(MillmError, status=503, code="insufficient_memory", type="invalid_request_error", retry_after=30): """A device ran out of memory."""
# fmt: on


class InsufficientMemoryToLoad(InsufficientMemory):
    """The named model has to be loaded and the device cannot hold it; carries the figures.

    Typed like the generation case (the request names something that does not fit, and retrying
    it unchanged only helps if memory is freed), and refused before the loaded model is unloaded.
    """

    def __init__(self, message: str, devices: list[dict], *, param: str | None = "model"):
        super().__init__(message, param=param)
        self.devices = devices

    def to_dict(self) -> dict:
        """OpenAI's four fields plus `devices`: needed and free bytes for each device."""
        return {**super().to_dict(), "devices": self.devices}


class ModelSourceError(Exception):
    """A model source (path, .gguf file, hub id) that cannot be resolved or loaded."""


def describe(exc: BaseException, limit: int = 300) -> str:
    """`Type: first line of the message`, short enough for an error body or a log line."""
    lines = str(exc).strip().splitlines()
    first = lines[0][:limit] if lines else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
