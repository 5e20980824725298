"""The openai SDK's Responses API (its chat API has its own tests beside the routes)."""

from __future__ import annotations

import openai

from tests.clients.frameworks.shapes import MAX_TOKENS, MODEL, PERSON_PROMPT, Answer, Person


def structured(url: str) -> Answer:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    response = client.responses.parse(
        model=MODEL,
        input=PERSON_PROMPT,
        text_format=Person,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    return Answer(output=response.output_parsed)
