"""Use cases. Each function takes what it needs (sessions, runtime, clock) explicitly."""
