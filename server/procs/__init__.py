"""`api_servers = N`: N API processes in front of one engine process (docs/batching.md, "API
server processes").

The API processes parse, validate, tokenize and render; the engine process owns every batcher,
backend and LLM engine. Between them: msgspec structs over ZMQ (`wire`), tensors as raw frames.
"""
