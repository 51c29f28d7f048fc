"""The data plane's adapters: the SSH gateway and the engine exec client it (and the web
terminal) use. Nothing here is imported by the API process's request path."""
