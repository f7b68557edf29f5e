"""/v1/models: the models a client may name."""
