"""Steered variants (/api/variants, docs/variants.md)."""
