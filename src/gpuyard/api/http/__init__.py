"""HTTP plumbing every surface shares: envelopes, errors, middlewares, rate limits,
permissions, pagination.
"""
