"""Jobs that make something to store: probes, steering vectors, calibrations, AutoSteer's
search. Training (facade.py) is the facade (calibrations start through manage). Upper tier."""
