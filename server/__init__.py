"""Ferry's HTTP layer: the only package that knows FastAPI."""

# One import name: ferry/server links here. Imported as `server`, each module would load a
# second time, and an exception raised under one name would not be caught under the other.
if __name__ != "ferry.server":
    raise ImportError(f"import ferry.server, not {__name__}: Ferry's packages have one name")
