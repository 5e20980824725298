"""Exporters: Hugging Face / PyTorch models into the artifacts Ferry serves (build time only)."""
