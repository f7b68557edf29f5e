"""Feature labels (/api/saes/{id}/labels, /features and /explanations; docs/labels.md): imported,
searched by words and by meaning, and written by a model that explains features from their
calibration examples."""
