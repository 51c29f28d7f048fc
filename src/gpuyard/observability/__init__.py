"""Prometheus metrics of one server: ``metrics`` (the per-app registry, the scrape-time
store collector, latency and reconciler histograms) and ``counters`` (event counters
other code increments, such as :func:`counters.record_auto_termination`)."""
