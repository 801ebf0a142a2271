"""Benchmarks: `make bench` (python -m bench) prints figures, targets and ratios."""
