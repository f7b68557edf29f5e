"""Steering as held in memory and stored: the live state (live: attached SAEs, feature ops,
the active base), the books of profiles, clusters, circuits and vectors (books, profiles,
documents, vectors), the SAE registry and decoders, and the per-request plan (plans,
resolution). Lower tier."""
