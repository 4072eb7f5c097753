"""Benchmarks (not tests): run as `python -m benchmarks.<name>`."""
