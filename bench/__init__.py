"""Benchmarks of the testbed's own parts: what they cost and what they add to a measurement."""
