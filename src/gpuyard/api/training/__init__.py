"""Seed 002's training-cluster API: routes and their OpenAPI."""
