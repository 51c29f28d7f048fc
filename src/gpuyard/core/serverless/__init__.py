"""Serverless endpoints, pure: job states (``jobs``) and how many workers an endpoint
wants (``scaling``)."""
