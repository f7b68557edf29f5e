"""/api/sensing and /api/circuit-sensing: co-activation and edge sensing, its switches, status,
events and live feed."""
