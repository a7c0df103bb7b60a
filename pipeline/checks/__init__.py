"""Checks made before any actor starts: config values and keys, the job's files and
settings, dtype names."""
