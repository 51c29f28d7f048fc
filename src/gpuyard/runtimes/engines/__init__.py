"""Container engines through the Docker Engine API (Docker and Podman): the runtime, its
engine connection, disks, logs, volume I/O, exec, inventory, pull errors, and the images
gpuyard builds for itself.
"""
