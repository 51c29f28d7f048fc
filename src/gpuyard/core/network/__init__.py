"""Network rules: security groups, the reserved-IP pool, embedded IPv4 literals, engine
addresses, the HTTP proxy's host names and credentials.
"""
