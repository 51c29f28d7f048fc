"""Core domain: models, states, errors, pricing, placement. Imports nothing from
the server, the store or the runtimes (enforced by tests/unit/test_layers.py)."""
