"""Settings naming the operator's OpenAI-compatible servers: the remote judge of steering
evaluations, the explainer endpoint of labelling and the embeddings endpoint of search by meaning.
URLs and keys come from here only, never from a request."""

from __future__ import annotations

from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from millm.settings.fields import env_field


class RemoteServers(BaseSettings):
    """The operator's remote servers (every field optional: none is needed to serve)."""

    model_config = SettingsConfigDict(extra="forbid", validate_default=True)

    judge_base_url: str | None = env_field(
        None,
        "MILLM_JUDGE_BASE_URL",
        "An OpenAI-compatible server (its /v1 URL) that steering evaluations may name as their "
        "judge (judge: remote).",
    )
    judge_model: str | None = env_field(None, "MILLM_JUDGE_MODEL", "The remote judge's model.")
    judge_api_key: str | None = env_field(None, "MILLM_JUDGE_API_KEY", "The remote judge's key.")
    explainer_base_url: str | None = env_field(
        None,
        "MILLM_EXPLAINER_BASE_URL",
        "An OpenAI-compatible server (its /v1 URL) that explaining SAE features may name as "
        "explainer or scorer (endpoint).",
    )
    explainer_model: str | None = env_field(
        None, "MILLM_EXPLAINER_MODEL", "The explainer endpoint's model."
    )
    explainer_api_key: SecretStr | None = env_field(
        None, "MILLM_EXPLAINER_API_KEY", "The explainer endpoint's key (never shown)."
    )
    embeddings_base_url: str | None = env_field(
        None,
        "MILLM_EMBEDDINGS_BASE_URL",
        "An OpenAI-compatible server (its /v1 URL) whose /embeddings label search by meaning "
        "uses; default: the served model's.",
    )
    embeddings_model: str | None = env_field(
        None, "MILLM_EMBEDDINGS_MODEL", "The embeddings endpoint's model."
    )
    embeddings_api_key: SecretStr | None = env_field(
        None, "MILLM_EMBEDDINGS_API_KEY", "The embeddings endpoint's key (never shown)."
    )
