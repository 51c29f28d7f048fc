"""HTTP surfaces: thin adapters from requests to use cases and back."""
