"""Volumes: network volumes and snapshots, and the bookkeeping of the storage work on them."""
