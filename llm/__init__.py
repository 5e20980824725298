"""LLM engines behind one small protocol; nothing here knows about HTTP."""
