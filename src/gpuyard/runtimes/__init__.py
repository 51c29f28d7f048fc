"""Runtime drivers. They import only gpuyard.core, never the server or the store."""
