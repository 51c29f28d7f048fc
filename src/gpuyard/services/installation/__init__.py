"""The installation itself: start-up, backup and restore, uninstall, its identity, replicas
and duty leases.
"""
