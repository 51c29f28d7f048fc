"""gpuyard: a self-hostable GPU cloud control plane."""

__version__ = "0.1.0"
