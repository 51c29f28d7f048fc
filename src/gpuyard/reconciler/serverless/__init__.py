"""Serverless endpoints' workers: the scaler duty (``scaler``), its steps on worker
clusters (``steps``), and what it asks of the job queue (``ports``; served by the
queue's use cases in ``queue_port``)."""
