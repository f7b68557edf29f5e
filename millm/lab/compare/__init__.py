"""Compare (/api/compare, docs/compare.md): one prompt answered side by side, unsteered and
under each setting."""
