"""Live monitoring: which requests are read (requests.py) and the monitor that keeps their feature
activations (monitor.py)."""
