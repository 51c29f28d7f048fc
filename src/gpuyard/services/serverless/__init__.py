"""Serverless endpoints: the endpoint resource (``endpoints``: create, read, change,
delete; typed inputs in ``endpoint_inputs``, answers in ``endpoint_views``)."""
