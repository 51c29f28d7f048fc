"""Training clusters: the operator that builds, changes and tears down a cluster's
Slurm nodes, and its helpers (node recovery, keys, networks, moves, edge rules,
auto-termination from Slurm's queue)."""
