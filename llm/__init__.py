"""LLM engines behind one small protocol; nothing here knows about HTTP."""

# One import name: ferry/llm links here. Imported as `llm`, each module would load a
# second time, and an exception raised under one name would not be caught under the other.
if __name__ != "ferry.llm":
    raise ImportError(f"import ferry.llm, not {__name__}: Ferry's packages have one name")
