"""The sink coordinator: exactly-once delivery of committed epochs with two-phase commit, its batch
records, the claim on a sink, where a sink starts, its lag and status, and writer errors named."""
