"""The revisions, 0001 to the newest; a package so that an installed wheel carries them."""
