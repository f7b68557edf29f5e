"""Bounds in the settings: their defaults, their environment variables, their floors."""

import pytest
from pydantic import ValidationError

from millm.settings import Settings


def test_max_rows_per_request(monkeypatch, tmp_path):
    monkeypatch.setenv("MILLM_HOME", str(tmp_path))
    assert Settings().max_rows_per_request == 256  # twice MAX_CHOICES (128): n alone never reaches it
    monkeypatch.setenv("MILLM_MAX_ROWS_PER_REQUEST", "12")
    assert Settings().max_rows_per_request == 12
    monkeypatch.setenv("MILLM_MAX_ROWS_PER_REQUEST", "0")
    with pytest.raises(ValidationError, match="max_rows_per_request|MILLM_MAX_ROWS_PER_REQUEST"):
        Settings()
