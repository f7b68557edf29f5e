"""Saved probes (book), bound to the loaded model (binding), as plan conditions (conditions) and
as a request's watches (watches)."""
