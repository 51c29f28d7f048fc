"""Other hosts' engines and kernels: runtimes made from engine URLs, SSH tunnels and
forwards, host ports asked of the host, firewall rules, training clusters' edge.
"""
