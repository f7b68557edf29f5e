"""The CLI: every setting is an option naming its environment variable; bad input exits cleanly."""

import subprocess
import sys

from millm.cli import build_parser, settings_from_args
from millm.settings import Settings, settings_options


def test_help_lists_every_option_and_environment_variable():
    result = subprocess.run(
        [sys.executable, "-m", "millm", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    help_text = " ".join(result.stdout.split())
    for name, env, _, _ in settings_options():
        assert "--" + name.replace("_", "-") in help_text
        assert f"env: {env}" in help_text
    for spec_name in ("MAX_PENDING_REQUESTS", "MILLM_HOME"):
        assert spec_name in help_text


def test_options_override_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MILLM_PORT", "9001")
    monkeypatch.setenv("MAX_PENDING_REQUESTS", "3")
    monkeypatch.setenv("MILLM_HOME", str(tmp_path))
    settings = settings_from_args(build_parser().parse_args(["serve", "--port", "9002"]))
    assert (
        settings.port == 9002 and settings.max_pending_requests == 3 and settings.home == tmp_path
    )
    assert settings.model == "SmolLM2-135M-Instruct" and settings.host == "127.0.0.1"


def test_defaults_home_to_a_per_user_folder(monkeypatch):
    monkeypatch.delenv("MILLM_HOME", raising=False)
    assert Settings().home.name == "millm"


def test_bad_setting_exits_2_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "millm", "serve", "--port", "notaport", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "port" in result.stderr and "Traceback" not in result.stderr


def test_bad_model_exits_2_naming_it(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "millm",
            "serve",
            "--model",
            str(tmp_path / "missing"),
            "--home",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode == 2 and "missing" in result.stderr and "Traceback" not in result.stderr
    )
