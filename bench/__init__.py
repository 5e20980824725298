"""Benchmarks: load generator, in-process baselines and the runs that compare them."""
