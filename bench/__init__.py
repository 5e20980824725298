"""Benchmarks: load generator, in-process baselines and the runs that compare them."""

# One import name: ferry/bench links here. Imported as `bench`, each module would load a
# second time, and an exception raised under one name would not be caught under the other.
if __name__ != "ferry.bench":
    raise ImportError(f"import ferry.bench, not {__name__}: Ferry's packages have one name")
