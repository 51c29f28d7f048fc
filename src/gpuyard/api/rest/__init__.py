"""REST v1/v2 routes (seed 000 and gpuyard's own resources): thin adapters from requests to
use cases.
"""
