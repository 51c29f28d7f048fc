"""Slurm node containers for training clusters: their configuration, image, runtime per
host, the node image's copy to a host, the overlay across hosts.
"""
