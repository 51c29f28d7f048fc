"""Access: how users reach their clusters (SSH keys, the HTTP proxy, security groups,
reserved IPs, host ports).
"""
