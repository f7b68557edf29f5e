"""The served model: the registry of models clients may name, registrations confined to allowed
paths, what a checkpoint's files say, the SAEs attached at start, and the switch that loads,
unloads and locks the one model slot (switch.py, with loading, unloading, lock, slot,
transitions); a job's model loaded beside the served one (beside.py)."""
