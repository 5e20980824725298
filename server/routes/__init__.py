"""Thin routes: parse, call the serving objects, respond."""
