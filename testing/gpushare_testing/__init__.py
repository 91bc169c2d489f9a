"""A local control plane and a GPU node simulator for tests, benchmarks and ``make run``."""
