"""Training clusters' domain: their states, actions and nodes, and their networks."""
