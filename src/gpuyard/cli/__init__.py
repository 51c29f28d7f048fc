"""The ``gpuyard`` command line: the server (``serve``), admin tools on the store
(``keys``, ``dev-image``) and an HTTP client for the REST v1 API (``clusters``, ...)."""
