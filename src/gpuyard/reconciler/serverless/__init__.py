"""Serverless endpoints' workers: the scaler duty (``scaler``), its steps on worker
clusters (``steps``), and what it asks of the job queue (``ports``, with a plain
implementation over the queue's tables in ``queue_port``)."""
