"""Ferry's HTTP layer: the only package that knows FastAPI."""
