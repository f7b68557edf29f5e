"""The one owner of mutable state, as rooms by capability. Lower tier (what the server holds):
runtime, models, steering, probes, features. Upper tier (what it does): serving, responses,
discovery, training, manage. composition.py makes every part once; facades.py gives the API
one facade per capability. See docs/architecture.md."""
