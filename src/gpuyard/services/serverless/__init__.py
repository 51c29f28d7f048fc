"""Serverless endpoints: their workers' rows (the clusters an endpoint's scaler starts
and stops), the durable job queue and the endpoints' use cases.
"""
