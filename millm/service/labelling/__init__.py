"""Labels a model writes: explaining SAE features from their calibration examples, and scoring the explanations."""
