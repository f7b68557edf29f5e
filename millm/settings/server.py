"""The server's settings: one pydantic-settings class read from the environment and the CLI
(its remote servers' fields in remote.py, every field made by fields.env_field).

Over 400 lines because it is one class of fields, each with its flag, its variable and its
help; a setting is found by reading down it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from millm.settings.fields import DEMO_MODEL_NAME, default_home, env_field
from millm.settings.remote import RemoteServers


class Settings(RemoteServers):
    """Everything `millm serve` can be told; the CLI and the environment fill the same fields."""

    # Only the aliases are read: by field name, `home` would pick up $HOME and `model` $MODEL.
    model_config = SettingsConfigDict(extra="forbid", validate_default=True)

    home: Path = env_field(
        None,
        "MILLM_HOME",
        "Data directory for everything the server stores (database, registered models and SAEs, "
        "caches).",
    )
    host: str = env_field("127.0.0.1", "MILLM_HOST", "Address to listen on.")
    port: int = env_field(8000, "MILLM_PORT", "TCP port to listen on.", ge=0, le=65535)
    model: str = env_field(
        DEMO_MODEL_NAME,
        "MILLM_MODEL",
        "Model to load: the demo name, a packaged model (gemma3-270m), a checkpoint directory, a "
        ".gguf file or a Hugging Face hub id.",
    )
    sae: Annotated[list[str], NoDecode] = env_field(
        [],
        "MILLM_SAES",
        "An SAE to register and attach once the model has loaded (repeat --sae for several; the "
        "variable takes a comma-separated list): a local path, RELEASE:SAE_ID (a SAELens release, "
        "say gemma-scope-2b-pt-res-canonical:layer_12/width_16k/canonical) or "
        "OWNER/NAME[:PATH][@REVISION] (a hub repository).",
    )
    sae_labels: Annotated[list[str], NoDecode] = env_field(
        [],
        "MILLM_SAE_LABELS",
        "Labels for the --sae SAEs, one per --sae in the same order ('-' for none; the variable is "
        "comma-separated): a labels file or URL, or 'neuronpedia' to fetch the SAE's Neuronpedia "
        "explanations.",
    )
    neuronpedia_url: str = env_field(
        "https://www.neuronpedia.org",
        "MILLM_NEURONPEDIA_URL",
        "Neuronpedia's address, for labels fetched by an SAE's Neuronpedia id (a self-hosted "
        "Neuronpedia works too).",
    )
    served_model_name: str | None = env_field(
        None,
        "MILLM_SERVED_MODEL_NAME",
        "Name clients use for the model (default: derived from --model).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = env_field(
        "auto",
        "MILLM_DTYPE",
        "Compute dtype; auto = bfloat16 on CUDA cards that compute it natively (Ampere on) and "
        "for Q4_1 GGUF files on the CPU (int4 kernels), else float32.",
    )
    reproducible: bool = env_field(
        False,
        "MILLM_REPRODUCIBLE",
        "Numbers that are the same on every x86 CPU: float32 on the CPU, transformers engine, "
        "kernels whose rounding does not depend on the CPU kind (slower; for tests and examples "
        "that compare exact text).",
    )
    engine: Literal["auto", "transformers", "llama.cpp"] = env_field(
        "auto",
        "MILLM_ENGINE",
        "What runs the forward pass: transformers (every feature), llama.cpp (.gguf files kept "
        "quantised; needs millm[gguf]), or auto = transformers unless a .gguf file's dequantised "
        "weights would not fit in memory and llama.cpp is installed.",
    )
    device: str = env_field(
        "auto", "MILLM_DEVICE", "auto (CUDA when present, else CPU), cpu, cuda or cuda:N."
    )
    max_model_len: int | None = env_field(
        None, "MILLM_MAX_MODEL_LEN", "Context window in tokens (default: the model's own).", ge=16
    )
    default_max_tokens: int = env_field(
        512,
        "MILLM_DEFAULT_MAX_TOKENS",
        "max_tokens for requests that send none (shrunk to what the context window leaves).",
        ge=1,
    )
    max_pending_requests: int = env_field(
        64,
        "MAX_PENDING_REQUESTS",
        "Requests admitted and waiting for the scheduler; past it, 503 queue_full at once.",
        ge=1,
    )
    max_rows_per_request: int = env_field(
        256,
        "MILLM_MAX_ROWS_PER_REQUEST",
        "Most rows one request may generate or score: its conversations (1 + extra_messages) "
        "times n, or its prompts times n; past it, 400 before anything runs (n alone is at most "
        "128).",
        ge=1,
    )
    enable_continuous_batching: bool = env_field(
        False,
        "ENABLE_CONTINUOUS_BATCHING",
        "Step every running request in one batch (joining after its own prefill, leaving when "
        "done); seeded requests still run on the serial path and response_format is refused.",
    )
    max_batch_size: int = env_field(
        16,
        "MAX_BATCH_SIZE",
        "Rows a continuous batch steps together; later requests wait in the queue.",
        ge=1,
    )
    prefix_cache_bytes: int | None = env_field(
        None,
        "PREFIX_CACHE_BYTES",
        "Bytes of keys and values of earlier prompts and answers kept for later requests that "
        "start the same way, under the same steering (least recently used dropped first); 0 turns "
        "the cache off. Default: an eighth of the device memory free once the model is loaded, at "
        "most 4 GiB.",
        ge=0,
    )
    prefill_chunk_tokens: int = env_field(
        512,
        "PREFILL_CHUNK_TOKENS",
        "Prompt tokens a joining request prefills between two decode steps of the running ones, "
        "so they keep streaming while a long prompt joins (alone, a prompt is prefilled in one "
        "pass).",
        ge=16,
    )
    graceful_unload_timeout: float = env_field(
        30.0,
        "GRACEFUL_UNLOAD_TIMEOUT",
        "Seconds an unload waits for running requests to finish before it moves any weight.",
        ge=0,
    )
    memory_limit_bytes: int | None = env_field(
        None,
        "MILLM_MEMORY_LIMIT_BYTES",
        "Most bytes a model's weights may take on its device; a load estimated above it is refused "
        "with 503 insufficient_memory before the loaded model is unloaded (default: the device's "
        "free memory).",
        ge=1,
    )
    batch_max_file_bytes: int = env_field(
        200 * 1024 * 1024,
        "MILLM_BATCH_MAX_FILE_BYTES",
        "Largest file POST /v1/files stores; past it, 400 batch_file_limit (nothing stored).",
        ge=1,
    )
    batch_max_rows: int = env_field(
        50_000,
        "MILLM_BATCH_MAX_ROWS",
        "Most lines a file POST /v1/files stores may hold; past it, 400 batch_file_limit.",
        ge=1,
    )
    batch_chunk_rows: int = env_field(
        8,
        "MILLM_BATCH_CHUNK_ROWS",
        "Lines of a batch run together, and recorded together (an interactive request waits for "
        "one chunk at most).",
        ge=1,
        le=256,
    )
    batch_claim_seconds: float = env_field(
        60.0,
        "MILLM_BATCH_CLAIM_SECONDS",
        "How long a replica's claim on a chunk of batch lines (or on a batch's end) holds without "
        "being renewed; a replica that died leaves its lines to the others after this.",
        ge=1,
        le=3600,
    )
    batch_pack_default: bool = env_field(
        False,
        "MILLM_BATCH_PACK_DEFAULT",
        "Whether a batch made without `pack` packs its scoring lines into shared passes (off: "
        "each line equals the synchronous route's answer bit for bit; see docs/batch.md).",
    )
    batch_lease_ttl_seconds: int = env_field(
        900,
        "MILLM_BATCH_LEASE_TTL_SECONDS",
        "How long a running batch's own lease on the loaded model lasts between renewals (it is "
        "renewed once a third of it has passed, and released when the batch stops).",
        ge=1,
        le=7200,
    )
    batch_max_completion_window_hours: int = env_field(
        168,
        "MILLM_BATCH_MAX_COMPLETION_WINDOW_HOURS",
        "Longest completion_window a batch may ask for, in hours (OpenAI's is 24h).",
        ge=1,
    )
    batch_file_retention_days: int = env_field(
        30,
        "MILLM_BATCH_FILE_RETENTION_DAYS",
        "Days an uploaded file is kept; then its bytes are dropped (its record says expired).",
        ge=1,
    )
    embeddings_max_inputs: int = env_field(
        128,
        "MILLM_EMBEDDINGS_MAX_INPUTS",
        "Most inputs one /v1/embeddings request may embed; past it, 400 before any model is "
        "touched.",
        ge=1,
        le=2048,
    )
    sae_activations_max_top_k: int = env_field(
        64,
        "SAE_ACTIVATIONS_MAX_TOP_K",
        "Largest top_k a return_sae_activations request may ask for.",
        ge=1,
    )
    sae_activations_max_entries: int = env_field(
        65536,
        "SAE_ACTIVATIONS_MAX_ENTRIES",
        "Largest worst case (positions x top_k, max_tokens counted in full) a "
        "return_sae_activations request may ask for.",
        ge=1,
    )
    discovery_max_texts: int = env_field(
        64,
        "MILLM_DISCOVERY_MAX_TEXTS",
        "Most texts (or conversations) in one set of a contrast, or pairs in a vector training; "
        "past it, 400 naming the set before anything runs.",
        ge=1,
    )
    discovery_max_tokens: int = env_field(
        16384,
        "MILLM_DISCOVERY_MAX_TOKENS",
        "Most tokens one inspect, contrast or vector-training request reads, all its texts "
        "together (texts x tokens); past it, 400 naming the field before any forward pass.",
        ge=2,
    )
    monitoring_history: int = env_field(
        1000,
        "MONITORING_HISTORY",
        "Per-request monitoring records kept (oldest dropped first).",
        ge=1,
    )
    monitoring_batch_history: int = env_field(
        10_000,
        "MONITORING_BATCH_HISTORY",
        "Monitoring records of batch lines kept apart from the live ones (oldest dropped first); "
        "they never reach the live feed or the statistics.",
        ge=1,
    )
    sensing_epsilon: float = env_field(
        0.1,
        "SENSING_EPSILON",
        "Sensing: a member fires where its activation is above this share of its max_activation.",
        gt=0,
    )
    sensing_theta_floor: float = env_field(
        0.0,
        "SENSING_THETA_FLOOR",
        "Sensing: the lowest threshold a member fires above (above 0, members without a "
        "max_activation fire above it too).",
        ge=0,
    )
    sensing_max_events_per_request: int = env_field(
        20,
        "SENSING_MAX_EVENTS_PER_REQUEST",
        "Sensing events one row records per cluster or circuit; the last kept says truncated.",
        ge=1,
    )
    sensing_max_events_kept: int = env_field(
        1000,
        "SENSING_MAX_EVENTS_KEPT",
        "Sensing events kept per cluster or circuit (the oldest dropped first).",
        ge=1,
    )
    sensing_max_age_days: float = env_field(
        7.0, "SENSING_MAX_AGE_DAYS", "Sensing events older than this are dropped.", gt=0
    )
    sensing_dedup_history: bool = env_field(
        True,
        "SENSING_DEDUP_HISTORY",
        "Sensing: a row's events inside the tokens it shares with the row sensed before it (a "
        "resent conversation) are not recorded again.",
    )
    sensing_context_tokens: int = env_field(
        16,
        "SENSING_CONTEXT_TOKENS",
        "Tokens kept each side of a sensing event's span (0: no context); a cluster's or "
        "circuit's own setting overrides it.",
        ge=0,
        le=64,
    )
    circuit_allow_concurrent: bool = env_field(
        False,
        "CIRCUIT_ALLOW_CONCURRENT",
        "Several circuits may be active at once, each claiming the layers it steers (a layer "
        "another holds is refused, unless composed with allow_layer_overlap); off, a second "
        "circuit's activation is refused while one is active.",
    )
    circuit_sensing_max_token_lag: int = env_field(
        8,
        "CIRCUIT_SENSING_MAX_TOKEN_LAG",
        "Edge sensing: the most tokens a downstream feature may fire after its upstream one "
        "(a circuit's own setting overrides it).",
        ge=1,
        le=64,
    )
    monitoring_prompt_max_chars: int = env_field(
        16384,
        "MONITORING_PROMPT_MAX_CHARS",
        "Characters of a monitored request's prompts kept for GET /api/monitoring/requests/{id} "
        "(each prompt's start, in order; past it the text is cut and marked truncated).",
        ge=0,
    )
    max_jobs: int = env_field(
        2,
        "MILLM_MAX_JOBS",
        "Jobs (calibration, AutoSteer, probe and vector training) that may run at once; past it, "
        "503 queue_full.",
        ge=1,
        le=16,
    )
    job_share: float = env_field(
        0.25,
        "MILLM_JOB_SHARE",
        "Most of the scheduler's time a job takes while requests are generating (it waits between "
        "its forward passes); alone, a job runs at full speed.",
        gt=0,
        le=1,
    )
    calibration_max_tokens: int = env_field(
        500_000,
        "MILLM_CALIBRATION_MAX_TOKENS",
        "Most tokens one calibration may read (every text's, after max_tokens_per_text); past it, "
        "400 before anything runs.",
        ge=1,
    )
    prompted_tools: Literal["auto", "on", "off"] = env_field(
        "auto",
        "MILLM_PROMPTED_TOOLS",
        'For models whose chat template takes no tools: offer tool_choice "auto" tools in a '
        "system message "
        "(on), never (off: answered as text, tools reported ignored), or only for models of 1B "
        "parameters and more (auto; smaller ones did not follow the format in our measurements).",
    )
    responses_max_stored: int = env_field(
        10_000,
        "MILLM_RESPONSES_MAX_STORED",
        "Most /v1/responses answers kept for GET and previous_response_id (oldest dropped first); "
        "0 keeps none.",
        ge=0,
    )
    responses_retention_days: float = env_field(
        30.0,
        "MILLM_RESPONSES_RETENTION_DAYS",
        "How long a stored /v1/responses answer is kept (OpenAI keeps 30 days).",
        gt=0,
    )
    explain_max_features: int = env_field(
        256,
        "MILLM_EXPLAIN_MAX_FEATURES",
        "Most features one explaining job may take; past it, 400 before anything runs.",
        ge=1,
    )
    explain_flag_below: float = env_field(
        0.6,
        "MILLM_EXPLAIN_FLAG_BELOW",
        "Explanations whose detection balanced accuracy is below this are kept but flagged.",
        ge=0,
        le=1,
    )
    explain_max_activation_bytes: int = env_field(
        256 << 20,
        "MILLM_EXPLAIN_MAX_ACTIVATION_BYTES",
        "Most bytes of activations one explaining job keeps (every chosen feature at every corpus "
        "token, float32); past it, 400 before anything runs.",
        ge=1,
    )
    dictionary_buffer_bytes: int = env_field(
        1 << 30,
        "MILLM_DICTIONARY_BUFFER_BYTES",
        "Most bytes of activations a dictionary training's shuffling buffer holds (rows x row "
        "width x 4: an SAE's row is the residual, a transcoder set's every block's MLP input and "
        "output); past it, 400 before anything runs.",
        ge=1 << 20,
    )
    dictionary_max_bytes: int = env_field(
        8 << 30,
        "MILLM_DICTIONARY_MAX_BYTES",
        "Most bytes a dictionary training's state takes (weights, gradients and Adam's two "
        "moments, float32: 16 bytes a parameter; for a transcoder set also every block's MLP, "
        "re-run in float32 for its targets); past it, 400 before anything runs.",
        ge=1 << 20,
    )
    dictionary_cache_bytes: int = env_field(
        8 << 30,
        "MILLM_DICTIONARY_CACHE_BYTES",
        "Most bytes of activations a dictionary training with several epochs keeps on disk (rows "
        "x row width x 4, as for the buffer); past it, 400 before anything runs.",
        ge=1 << 20,
    )
    ignored_fields_header_max_bytes: int = env_field(
        1024,
        "IGNORED_FIELDS_HEADER_MAX_BYTES",
        'Cap of the X-miLLM-Ignored-Fields header; past it the last entry is "+N more".',
        ge=64,
    )
    cluster_intensity_min: float = env_field(
        0.5,
        "CLUSTER_INTENSITY_MIN",
        'Floor of the cluster dial\'s "min" when a cluster declares no intensity_range.',
        ge=0,
        le=2,
    )
    circuit_intensity_min: float = env_field(
        0.0,
        "CIRCUIT_INTENSITY_MIN",
        "Floor of the circuit dial when a circuit declares no intensity_range.",
        ge=0,
        le=2,
    )
    steering_intensity_max: float = env_field(
        2.0,
        "STEERING_INTENSITY_MAX",
        "The configured maximum of the intensity dial (within the [0, 2] envelope).",
        ge=0,
        le=2,
    )
    database_url: str | None = env_field(
        None,
        "DATABASE_URL",
        "SQLAlchemy URL of the store (e.g. postgresql+psycopg://user@host/db); default: SQLite in "
        "the data directory.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = env_field(
        "info", "MILLM_LOG_LEVEL", "Log level."
    )
    api_key: SecretStr | None = env_field(
        None,
        "MILLM_API_KEY",
        "Key clients send as 'Authorization: Bearer <key>' for /v1 (unset: /v1 is open). "
        "Prefer MILLM_API_KEY_FILE: a command-line key shows in process listings.",
    )
    api_key_file: Path | None = env_field(
        None, "MILLM_API_KEY_FILE", "File holding MILLM_API_KEY (first line)."
    )
    admin_key: SecretStr | None = env_field(
        None,
        "MILLM_ADMIN_KEY",
        "Key for every /api route that changes state; it also opens /v1 (unset: those routes are "
        "open).",
    )
    admin_key_file: Path | None = env_field(
        None, "MILLM_ADMIN_KEY_FILE", "File holding MILLM_ADMIN_KEY (first line)."
    )
    allowed_paths: Annotated[list[Path], NoDecode] = env_field(
        [],
        "MILLM_ALLOWED_PATHS",
        "Directories (os.pathsep-separated, like PATH) besides the data directory from which "
        "paths sent over HTTP (SAE and model registration) may be read; --model is always allowed.",
    )
    max_request_bytes: int = env_field(
        4 * 1024 * 1024,
        "MAX_REQUEST_BYTES",
        "Largest request body; past it, 413 before the body is read.",
        ge=1024,
    )
    max_import_bytes: int = env_field(
        1_000_000,
        "MAX_IMPORT_BYTES",
        "Largest body of a profile, cluster, circuit or feature-labels import; past it, 413 "
        "document_too_large.",
        ge=1024,
    )

    @field_validator("home", mode="before")
    @classmethod
    def _default_home(cls, value):
        # An empty MILLM_HOME means "not set", as in most shells' conventions.
        return default_home() if value in (None, "") else value

    @field_validator("home")
    @classmethod
    def _absolute_home(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @field_validator("sae", "sae_labels", mode="before")
    @classmethod
    def _split_list(cls, value):
        # Comma-separated in the environment; the CLI's repeated option gives a list already.
        if isinstance(value, str):
            value = value.split(",")
        return [entry.strip() for entry in value if entry.strip()] if value is not None else []

    @field_validator("allowed_paths", mode="before")
    @classmethod
    def _split_paths(cls, value):
        # PATH-style in the environment and on the command line; an empty entry means nothing.
        if isinstance(value, str):
            value = value.split(os.pathsep)
        return [entry for entry in value if str(entry).strip()] if value is not None else []

    @field_validator("allowed_paths")
    @classmethod
    def _absolute_paths(cls, value: list[Path]) -> list[Path]:
        return [path.expanduser().resolve() for path in value]

    @model_validator(mode="after")
    def _reproducible_numerics(self):
        # Only float32 on the CPU, on kernels millm chooses, can be made the same on every CPU kind.
        if not self.reproducible:
            return self
        for name, value, allowed, fixed in (
            ("MILLM_DTYPE", self.dtype, ("auto", "float32"), "float32"),
            ("MILLM_ENGINE", self.engine, ("auto", "transformers"), "transformers"),
            ("MILLM_DEVICE", self.device, ("auto", "cpu"), "cpu"),
        ):
            if value not in allowed:
                raise ValueError(
                    f"MILLM_REPRODUCIBLE runs {fixed} only; {name} {value!r} cannot be reproduced "
                    "across CPUs"
                )
        self.dtype, self.engine, self.device = "float32", "transformers", "cpu"
        return self

    @model_validator(mode="after")
    def _keys_from_files(self):
        self.api_key = key_setting(self.api_key, self.api_key_file, "MILLM_API_KEY")
        self.admin_key = key_setting(self.admin_key, self.admin_key_file, "MILLM_ADMIN_KEY")
        if (
            self.api_key is not None
            and self.admin_key is not None
            and self.api_key.get_secret_value() == self.admin_key.get_secret_value()
        ):
            # One key for both would let every chat client change what all the others get.
            raise ValueError(
                "MILLM_API_KEY and MILLM_ADMIN_KEY must differ (the admin key alone opens /v1 too)"
            )
        return self

    @property
    def cache_dir(self) -> Path:
        """Caches the server writes (dequantised GGUF checkpoints, ...)."""
        return self.home / "cache"

    @property
    def hub_dir(self) -> Path:
        """Where hub downloads go (the user's own Hugging Face cache is only read)."""
        return self.home / "hub"


def key_setting(key: SecretStr | None, file: Path | None, env: str) -> SecretStr | None:
    """A key given directly or read from its file (first line); refused when both are given, or
    unusable."""
    if key is not None and file is not None:
        raise ValueError(f"give {env} or {env}_FILE, not both")
    if file is not None:
        try:
            lines = file.expanduser().read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"{env}_FILE {str(file)!r} cannot be read ({type(exc).__name__})"
            ) from None
        key = SecretStr(lines[0].strip() if lines else "")
    if key is None:
        return None
    value = key.get_secret_value()
    # A bearer token travels in an HTTP header: visible ASCII only, and something to guess.
    if not value or not all("!" <= c <= "~" for c in value):
        raise ValueError(f"{env} must be non-empty visible ASCII without spaces")
    return key


def settings_with(overrides: dict[str, object]) -> Settings:
    """Settings from the environment with some fields (by field name) overridden."""
    env_names = {name: env for name, env, _, _ in settings_options()}
    # Keyed by alias and validated by pydantic at run time, so the values are Any to the checker.
    by_alias: dict[str, Any] = {env_names[name]: value for name, value in overrides.items()}
    return Settings(**by_alias)


def settings_options() -> list[tuple[str, str, object, str]]:
    """(field name, environment variable, default, description) for every setting, in order: the
    server's own, then its remote servers'."""
    remote = set(RemoteServers.model_fields)
    fields = Settings.model_fields.items()
    rows: list[tuple[str, str, object, str]] = []
    for name, info in [(n, f) for n, f in fields if n not in remote] + [
        (n, f) for n, f in fields if n in remote
    ]:
        extra = info.json_schema_extra
        env = extra.get("env") if isinstance(extra, dict) else None
        rows.append(
            (
                name,
                env if isinstance(env, str) else name.upper(),
                info.default,
                info.description or "",
            )
        )
    return rows
