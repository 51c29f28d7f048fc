"""Training clusters (seed 002): their use cases, inputs, node placement, views, stops and
drains.
"""
