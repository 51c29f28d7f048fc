"""Networking the control plane does itself: the userspace TCP forwarder that makes
reserved IPs and security groups real. Imports only gpuyard.core."""
