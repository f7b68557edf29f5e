"""AutoSteer (/api/autosteer, docs/steering.md): a search over features and strengths that
moves the model towards a goal; service.py also starts the probe and vector training jobs."""
