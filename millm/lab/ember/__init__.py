"""Goodfire's Ember API (`/api/inference/v1/`), spoken for the `goodfire` SDK over millm's own
services: a translation room, no capability of its own."""
