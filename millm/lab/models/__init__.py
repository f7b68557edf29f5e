"""Model administration (/api/models, docs/models.md): register, load, unload, lock."""
