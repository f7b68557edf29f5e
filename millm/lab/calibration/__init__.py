"""Calibration (/api/saes/{id}/calibrate and /calibration, docs/calibration.md): a corpus read
through an SAE, each feature's quantiles and top examples kept."""
