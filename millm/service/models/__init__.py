"""The served model: the registry of models clients may name (registry), client registrations
confined to allowed paths (registrations, paths), what a checkpoint's files say (checkpoints,
engines), and the switch that loads, unloads and locks the one model slot (switch, with
loading, unloading, lock, slot, transitions). Lower tier; the switch is its facade."""
