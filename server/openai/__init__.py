"""OpenAI-compatible chat and completions: protocol schemas and serving logic (no app wiring)."""
