"""Development tools: the offline "web" image (web_image.py, built from the C server
web_server.c shipped here), made by ``gpuyard dev-image`` and used by the proxy's
tests and benchmark."""
