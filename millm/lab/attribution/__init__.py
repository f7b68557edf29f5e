"""Attribution graphs (/api/attribution, docs/attribution.md): which features drove a logit,
computed on the served model and checked on it."""
