"""The reconciler's periodic duties, one module each: heartbeats, observation, volume
scans, budgets, auto-termination, orphans, utilisation and volume usage, and the HTTP
proxy's sync."""
