"""Discovery (/api/saes/{id}/inspect and /contrast, /api/lens; docs/discovery.md): reads through
attached SAEs that change nothing stored: inspect, contrast, the unsteered judge, the logit lens."""
