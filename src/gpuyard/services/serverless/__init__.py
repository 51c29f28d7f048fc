"""Serverless endpoints' jobs: the durable queue (``queue``), RunPod's job API as use
cases (``jobs``), the worker protocol (``worker_calls``, ``worker_env``), what each
reconciler pass does to the queue (``sweep``) and completion webhooks (``webhooks``)."""
