"""Steered variants: names clients use as models, each a base model and its steering (book.py
stores them, naming.py turns a request's model name into the base and the variant's plans)."""
