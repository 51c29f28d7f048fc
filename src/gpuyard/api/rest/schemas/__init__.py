"""OpenAPI models and JSON shapes of the REST routes."""
