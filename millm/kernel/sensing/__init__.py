"""Co-activation and edge sensing: what is armed, and the events rows record."""
