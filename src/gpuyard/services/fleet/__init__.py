"""The fleet: hosts as registered, discovered, administered, watched by heartbeats, and
their quarantined leftovers.
"""
