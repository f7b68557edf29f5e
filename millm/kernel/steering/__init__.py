"""Steering as held in memory: the live state (live: attached SAEs, feature ops, the active base),
the SAE registry and decoders, dial limits, and the per-request plan (plans, plan, resolution,
plan_cache)."""
