"""Serverless endpoints: the endpoint resource (``endpoints``: create, read, change,
delete; typed inputs in ``endpoint_inputs``, answers in ``endpoint_views``), their jobs'
durable queue (``queue``), RunPod's job API as use cases (``jobs``), the worker protocol
(``worker_calls``, ``worker_env``), what each reconciler pass does to the queue
(``sweep``), completion webhooks (``webhooks``) and the worker rows (``workers``)."""
