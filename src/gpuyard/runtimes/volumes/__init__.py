"""Volumes as streams: archives read from and written to any runtime, copies and moves
between hosts' engines, sized volume images.
"""
