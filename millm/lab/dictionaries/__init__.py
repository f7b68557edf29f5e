"""Dictionaries made and judged here: SAEs trained on the served model with SAELens, and any
registered dictionary's grade."""
