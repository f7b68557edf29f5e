"""Calibration (/api/saes/{id}/calibrate, docs/labels.md): a corpus read through an SAE, each
feature's percentiles and top examples kept."""
