"""Steering vectors (/api/vectors, docs/vectors.md): trained from contrasting prompts or
imported, and stored."""
