"""The Anthropic Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), run on the
chat path."""
