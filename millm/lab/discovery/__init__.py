"""Discovery (/api/discovery, docs/discovery.md): reads through attached SAEs that change
nothing stored: inspect, contrast, explain a vector, the unsteered judge, the logit lens."""
