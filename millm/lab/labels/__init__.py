"""Feature labels (/api/labels, docs/labels.md): imported, searched by words and by meaning, and
written by a model that explains features from their calibration examples."""
