"""Inference backends behind one small async interface (see `backends.base.Backend`)."""
