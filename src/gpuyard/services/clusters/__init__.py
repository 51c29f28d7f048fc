"""Clusters: the use cases of one container cluster, its configuration, views, logs, moves,
and the status write funnel.
"""
