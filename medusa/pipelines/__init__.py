"""Benchmarks and the resumable pipeline stages they share with ``medusa demo``."""
