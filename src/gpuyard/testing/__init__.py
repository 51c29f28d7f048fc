"""Stand-ins for tests and benchmarks: the in-memory runtime (fake_runtime.py, with its
logs in fake_logs.py and its volumes' tar streams in fake_volumes.py) and the in-memory
Slurm node runtime (fake_nodes.py). They follow the contracts of the real drivers
(runtimes/capabilities.py; tests/contract checks both alike) with every state change
immediate. Production code never imports this package."""
