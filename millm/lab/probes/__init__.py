"""Probes (/api/probes, docs/probes.md): trained, stored, and read as conditions and watches."""
