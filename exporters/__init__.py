"""Exporters: Hugging Face / PyTorch models into the artifacts Ferry serves (build time only)."""

# One import name: ferry/exporters links here. Imported as `exporters`, each module would load a
# second time, and an exception raised under one name would not be caught under the other.
if __name__ != "ferry.exporters":
    raise ImportError(f"import ferry.exporters, not {__name__}: Ferry's packages have one name")
