"""A cluster's fetch-and-apply steps: start, stop, terminate, restart, restore and
collection of its container (driver.py and its helpers), and the storage work of its
volume (snapshots, restores, migrations)."""
