"""How a setting is declared: a field read from its environment variable (and the CLI flag made
from it), with the description the CLI's help and docs/serving.md show."""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import AliasChoices, Field

DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"


def env_field(default, env: str, description: str, **kwargs):
    """A settings field read from exactly one environment variable (named as the spec names it)."""
    return Field(
        default,
        validation_alias=AliasChoices(env),
        description=description,
        json_schema_extra={"env": env},
        **kwargs,
    )


def default_home() -> Path:
    """The per-user data folder used when MILLM_HOME is not set."""
    return Path(platformdirs.user_data_dir("millm", appauthor=False))
