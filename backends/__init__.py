"""Inference backends behind one small async interface (see `backends.base.Backend`)."""

# One import name: ferry/backends links here. Imported as `backends`, each module would load a
# second time, and an exception raised under one name would not be caught under the other.
if __name__ != "ferry.backends":
    raise ImportError(f"import ferry.backends, not {__name__}: Ferry's packages have one name")
