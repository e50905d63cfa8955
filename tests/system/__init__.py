"""End-to-end tests: the demo, chaos, faults, many processes, the benchmarks, the public API, the lock file."""
