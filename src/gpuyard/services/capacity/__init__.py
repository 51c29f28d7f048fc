"""Capacity: claiming and releasing GPUs, vCPUs and memory on hosts, and choosing the host."""
