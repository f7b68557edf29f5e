"""Steering (/api/steering, /api/saes, /api/profiles, docs/steering.md): SAEs attached, features
turned up or down, profiles saved and applied."""
