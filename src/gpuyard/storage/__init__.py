"""Adapters for storage tools: the restic snapshot repository and tar stream accounting."""
