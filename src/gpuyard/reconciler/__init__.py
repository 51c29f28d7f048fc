"""Level-based loops that drive clusters toward their desired state."""
