"""Compare (/api/compare, docs/discovery.md): one prompt answered side by side, unsteered and
under each setting."""
