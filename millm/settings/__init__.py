"""Server settings (server.py), their remote servers (remote.py) and how a field is declared
(fields.py)."""

from millm.settings.fields import DEMO_MODEL_NAME, default_home, env_field
from millm.settings.server import Settings, key_setting, settings_options, settings_with

__all__ = [
    "DEMO_MODEL_NAME",
    "Settings",
    "default_home",
    "env_field",
    "key_setting",
    "settings_options",
    "settings_with",
]
