"""Bounds in the settings: their defaults, their environment variables, their floors."""

import pytest
from pydantic import ValidationError

from millm.settings import Settings


def test_max_rows_per_request(monkeypatch, tmp_path):
    monkeypatch.setenv("MILLM_HOME", str(tmp_path))
    # twice MAX_CHOICES (128): n alone never reaches it
    assert Settings().max_rows_per_request == 256
    monkeypatch.setenv("MILLM_MAX_ROWS_PER_REQUEST", "12")
    assert Settings().max_rows_per_request == 12
    monkeypatch.setenv("MILLM_MAX_ROWS_PER_REQUEST", "0")
    with pytest.raises(ValidationError, match="max_rows_per_request|MILLM_MAX_ROWS_PER_REQUEST"):
        Settings()


def test_reproducible_numerics_are_float32_on_the_cpu_with_transformers(monkeypatch, tmp_path):
    monkeypatch.setenv("MILLM_HOME", str(tmp_path))
    monkeypatch.setenv("MILLM_REPRODUCIBLE", "1")
    settings = Settings()
    assert (settings.reproducible, settings.dtype, settings.engine, settings.device) == (
        True,
        "float32",
        "transformers",
        "cpu",
    )
    for name, value in (
        ("MILLM_DTYPE", "bfloat16"),
        ("MILLM_ENGINE", "llama.cpp"),
        ("MILLM_DEVICE", "cuda"),
    ):
        monkeypatch.setenv(name, value)
        with pytest.raises(
            ValidationError,
            match=f"MILLM_REPRODUCIBLE runs .* only; {name} '{value}' cannot be reproduced across "
            "CPUs",
        ):
            Settings()
        monkeypatch.delenv(name)
    monkeypatch.setenv("MILLM_REPRODUCIBLE", "0")
    assert Settings().dtype == "auto"
