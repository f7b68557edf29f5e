"""What the server knows about SAE features: labels and their search (labels, label_search),
calibrations (calibrations), and live monitoring (monitoring). Lower tier."""
