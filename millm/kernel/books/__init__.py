"""The books: stored documents held in memory and kept in step with the store (base.py's Book):
profiles, clusters and circuits, vectors, labels and their search, calibrations, transcoders."""
