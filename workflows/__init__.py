"""Deterministic workflow code: no I/O here, only the pass and its ordering."""
